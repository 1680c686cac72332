//! The run options several commands share: devices, split mode, threads, faults, tuning.

use clap::Args;
use harness::error::{HarnessError, Result};
use harness::session::{AllGather, RunConfig, SplitMode};

/// Devices and how to use them (shared by perplexity and bench).
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Threads in total (shared by virtual CPU devices).
    #[arg(short = 't', long, default_value_t = default_threads())]
    threads: usize,
    /// Devices: cpu, cpu:N, cuda:G, cuda:GxN, cuda-sim:G, cuda-sim:GxN (emulated GPUs),
    /// comma-separated.
    #[arg(long, default_value = "cpu")]
    devices: String,
    /// How to spread the model over the devices.
    #[arg(long, value_enum, default_value_t = SplitModeArg::None)]
    split_mode: SplitModeArg,
    /// Pipeline slots (layer split).
    #[arg(long, default_value_t = 1)]
    n_copies: usize,
    /// With --split-mode tensor-reduce: partial sums of at least BYTES cross devices as
    /// BF16 (the sums stay F32); default: always F32.
    #[arg(long, value_name = "BYTES")]
    reduce_bf16_min: Option<usize>,
    /// With --split-mode tensor: `ring` pipelines each all-gather with the product it
    /// feeds (token chunks, copies on a copy engine per device, forwarded round the ring of
    /// devices); bit-identical.
    #[arg(long, value_enum, default_value_t = AllGatherArg::Concat)]
    all_gather: AllGatherArg,
    /// Make device D (index in --devices) fail at the OP-th node of its part of the graph:
    /// KIND alloc (its OP-th buffer allocation), kernel (the op reports an error) or hang
    /// (its queue never completes; the run times out); on cuda-sim devices also the
    /// emulated driver's errors illegal-address, launch, peer-copy and event.
    #[arg(long, value_name = "D:OP:KIND")]
    inject_fault: Option<harness::faults::FaultSpec>,
    /// Seconds the host waits for a device before the run fails with an error naming the
    /// device and the wait (0: for ever).
    #[arg(long, value_name = "SECS", default_value_t = 300.0)]
    wait_timeout: f64,
    /// Tokens per micro-batch: a batch is cut into passes of this many tokens that flow
    /// through the layer split back to back (default: the whole batch in one pass).
    #[arg(long, value_name = "N")]
    ubatch: Option<usize>,
    /// Share of the layers per device for the layer split, e.g. `3,1` (default: equal).
    #[arg(long, value_delimiter = ',', value_name = "P,P,...")]
    tensor_split: Vec<f32>,
    /// Check every queue access for races (happens-before checker); races are printed on
    /// stderr and make the run fail.
    #[arg(long)]
    check_races: bool,
    /// Random delays in CPU queues and cuda-sim streams from this seed (chaos mode).
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,
    /// Queue on which copies between CPU devices run.
    #[arg(long, value_enum, default_value_t = CopyQueueArg::Destination)]
    cpu_copy_queue: CopyQueueArg,
    /// Leave the CPU devices' compute threads free to move between CPUs. By default each
    /// thread is pinned to a CPU of its own where the process's affinity mask has enough
    /// (two threads stacked on one CPU make every barrier wait for a time slice); pass
    /// this where other programs compute on the same CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Speed features of the CUDA devices, a comma-separated list applied to the default
    /// (everything on): no-graphs, no-pdl, no-fuse, no-fuse-norm, no-fuse-qkv,
    /// no-fuse-rope-store, no-fuse-qkv-rope, no-fuse-glu, no-fuse-add, no-qgemm,
    /// no-mma-attn, no-row-attn (decode attention on flash_attn_dec), no-attn-row-split,
    /// no-decode-lanes (decode-class products in one chain per output), q8-window (Q8_0 weights through 16-byte window loads), legacy-products,
    /// legacy-decode-attn, legacy-prompt-attn, legacy (the backend as first measured),
    /// default. Results stay bit-identical except across the legacy kernel generations and
    /// no-decode-lanes.
    #[arg(long, value_name = "LIST", default_value = "default")]
    cuda_tuning: ggml_cuda::CudaTuning,
    /// Launch every CUDA kernel from the host (the same as `--cuda-tuning no-graphs`).
    #[arg(long)]
    no_cuda_graphs: bool,
    /// Weaken the scheduler on purpose: own-event, no-slot-wait, async-user-input,
    /// no-alloc-wait, engine-early, engine-reuse, engine-no-arrival (to watch the
    /// checker catch each bug).
    #[arg(long, hide = true, value_delimiter = ',')]
    weaken: Vec<String>,
}

/// `--split-mode`: [`SplitMode`] on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum SplitModeArg {
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

impl From<SplitModeArg> for SplitMode {
    fn from(a: SplitModeArg) -> SplitMode {
        match a {
            SplitModeArg::None => SplitMode::None,
            SplitModeArg::Layer => SplitMode::Layer,
            SplitModeArg::Tensor => SplitMode::Tensor,
            SplitModeArg::TensorReduce => SplitMode::TensorReduce,
        }
    }
}

/// `--all-gather`: [`AllGather`] on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum AllGatherArg {
    /// Gather the whole tensor on every device, then multiply.
    Concat,
    /// Cut the tokens into one chunk per device and pipeline: each device multiplies
    /// chunk c while chunk c + 1 crosses on a copy engine (a queue of its own per
    /// device), forwarded round the ring of devices (device d receives from d - 1 only),
    /// so copies hide behind compute. Bit-identical to `concat`.
    Ring,
}

impl From<AllGatherArg> for AllGather {
    fn from(a: AllGatherArg) -> AllGather {
        match a {
            AllGatherArg::Concat => AllGather::Concat,
            AllGatherArg::Ring => AllGather::Ring,
        }
    }
}

/// `--cpu-copy-queue`: [`ggml_core::CopyQueue`] on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum CopyQueueArg {
    /// On the source device's queue (CUDA style).
    Source,
    /// On the destination device's queue.
    Destination,
}

/// Parses `--weaken` names.
pub fn parse_weaken(names: &[String]) -> Result<Vec<ggml_sched::WeakenKnob>> {
    names
        .iter()
        .map(|w| {
            ggml_sched::WeakenKnob::from_name(w).ok_or_else(|| {
                HarnessError::Usage(format!(
                    "--weaken {w}: expected one of {}",
                    ggml_sched::WeakenKnob::ALL.map(|k| k.name()).join(", ")
                ))
            })
        })
        .collect()
}

impl RunArgs {
    /// The session configuration these flags describe; an error for a bad value.
    pub fn config(&self) -> Result<RunConfig> {
        let weaken = parse_weaken(&self.weaken)?;
        if let Some(bad) = self
            .tensor_split
            .iter()
            .find(|v| !(v.is_finite() && **v >= 0.0))
        {
            return Err(HarnessError::Usage(format!(
                "--tensor-split {bad}: proportions must be finite and >= 0"
            )));
        }
        Ok(RunConfig {
            devices: self.devices.parse()?,
            split_mode: self.split_mode.into(),
            n_copies: self.n_copies,
            threads: self.threads,
            chaos: self.chaos,
            check_races: self.check_races,
            weaken,
            cpu_copy_queue: match self.cpu_copy_queue {
                CopyQueueArg::Source => ggml_core::CopyQueue::Source,
                CopyQueueArg::Destination => ggml_core::CopyQueue::Destination,
            },
            tensor_split: (!self.tensor_split.is_empty()).then(|| self.tensor_split.clone()),
            n_ubatch: match self.ubatch {
                Some(0) => return Err(HarnessError::Usage("--ubatch must be at least 1".into())),
                Some(u) => u,
                None => 0,
            },
            reduce_bf16_min: self.reduce_bf16_min,
            all_gather: self.all_gather.into(),
            inject_fault: self.inject_fault.map(harness::faults::FaultSpec::injector),
            pin_threads: !self.no_pin,
            cuda_tuning: ggml_cuda::CudaTuning {
                graphs: self.cuda_tuning.graphs && !self.no_cuda_graphs,
                ..self.cuda_tuning
            },
            wait_timeout: match self.wait_timeout {
                0.0 => None,
                t if t.is_finite() && t > 0.0 => Some(std::time::Duration::from_secs_f64(t)),
                t => {
                    return Err(HarnessError::Usage(format!(
                        "--wait-timeout {t}: expected seconds >= 0"
                    )))
                }
            },
        })
    }
}

/// Every CPU the process may use.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
