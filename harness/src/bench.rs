//! `bench`: prompt processing and generation speed, as llama-bench measures them.

use std::time::Instant;

use crate::batch::Batch;
use crate::error::{HarnessError, Result};
use crate::executor::Executor;
use crate::model::Model;
use crate::placement::KvCache;
use crate::session::TimedBackend;

/// One measured test (`pp512`, `tg128`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BenchResult {
    /// Test name as llama-bench prints it.
    pub test: String,
    /// Tokens per repetition.
    pub n_tokens: usize,
    /// Mean tokens per second over repetitions.
    pub tps_mean: f64,
    /// Standard deviation of tokens per second.
    pub tps_stddev: f64,
    /// Tokens per second of each repetition.
    pub samples: Vec<f64>,
    /// Bytes copied between devices per token (measured repetitions only).
    pub bytes_moved_per_token: f64,
    /// Host syncs per token: the plan's (HB5) plus the reads of the logits (HB7).
    pub host_syncs_per_token: f64,
    /// For generation: bytes of weights each token reads
    /// ([`Model::weight_bytes_per_token`]); 0 for prompt processing.
    pub weight_bytes_per_token: f64,
    /// What the CUDA devices asked of their driver on the host, per generated token (tg)
    /// or per prompt pass (pp), summed over devices; `None` without CUDA devices.
    pub cuda_host: Option<CudaHostCounts>,
}

/// The host counters of the CUDA devices ([`ggml_cuda::HostCounters`]) per generated
/// token or per prompt pass, summed over devices, over the measured repetitions.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CudaHostCounts {
    /// Kernels the GPUs ran (graph nodes of replayed CUDA graphs included).
    pub kernel_launches: f64,
    /// CUDA graph launches.
    pub graph_launches: f64,
    /// Nodes of the replayed graphs.
    pub graph_nodes: f64,
    /// Driver calls made on the host.
    pub driver_calls: f64,
    /// Of them, `cuLaunchKernel`.
    pub launch_calls: f64,
    /// Times the host waited for a GPU.
    pub host_syncs: f64,
    /// Bytes copied host to GPU.
    pub h2d_bytes: f64,
    /// Bytes copied GPU to host.
    pub d2h_bytes: f64,
    /// `graph_compute` calls (splits run).
    pub splits: f64,
    /// Host time of `graph_compute` per node passed to it, in µs.
    pub host_us_per_node: f64,
    /// The driver calls by kind ([`ggml_cuda::DriverCalls`]'s fields).
    pub calls_by_kind: std::collections::BTreeMap<&'static str, f64>,
}

impl CudaHostCounts {
    /// `c` (counts over `n` tokens or passes) per token or pass.
    pub fn per(c: &ggml_cuda::HostCounters, n: usize) -> CudaHostCounts {
        let n = n.max(1) as f64;
        CudaHostCounts {
            kernel_launches: c.kernel_launches as f64 / n,
            graph_launches: c.graph_launches as f64 / n,
            graph_nodes: c.graph_nodes as f64 / n,
            driver_calls: c.driver_calls() as f64 / n,
            launch_calls: c.calls.launch as f64 / n,
            host_syncs: c.host_syncs as f64 / n,
            h2d_bytes: c.h2d_bytes as f64 / n,
            d2h_bytes: c.d2h_bytes as f64 / n,
            splits: c.graph_compute_calls as f64 / n,
            host_us_per_node: c.host_ns_per_node() / 1e3,
            calls_by_kind: c
                .calls
                .by_kind()
                .into_iter()
                .map(|(k, v)| (k, v as f64 / n))
                .collect(),
        }
    }
}

/// The sum of the host counters of `devices`.
fn host_counters(devices: &[&ggml_cuda::CudaBackend]) -> ggml_cuda::HostCounters {
    devices.iter().map(|d| d.host_counters()).sum()
}

/// One line per result with CUDA host counters: what the host asked of the GPUs' driver
/// per generated token or prompt pass.
pub fn host_counter_lines(results: &[BenchResult]) -> String {
    let mut s = String::new();
    for r in results {
        let Some(c) = &r.cuda_host else { continue };
        let per = match r.weight_bytes_per_token > 0.0 {
            true => "per generated token",
            false => "per prompt pass",
        };
        s.push_str(&format!(
            "{} on CUDA, {per}: {:.1} splits, {:.1} kernel launches, {:.2} graph launches \
             ({:.1} graph nodes), {:.1} driver calls ({:.1} cuLaunchKernel), {:.2} host syncs, \
             H2D {:.0} B, D2H {:.0} B, graph_compute {:.2} µs of host time per node\n",
            r.test,
            c.splits,
            c.kernel_launches,
            c.graph_launches,
            c.graph_nodes,
            c.driver_calls,
            c.launch_calls,
            c.host_syncs,
            c.h2d_bytes,
            c.d2h_bytes,
            c.host_us_per_node,
        ));
    }
    s
}

impl BenchResult {
    /// Bytes of weights read per second (generation only: weights per token × tokens/s).
    pub fn weight_read_bandwidth(&self) -> f64 {
        self.weight_bytes_per_token * self.tps_mean
    }
}

/// Bytes per second `threads` threads read streaming a 256 MiB buffer (far beyond the
/// caches), the best of 5 passes: what the machine's memory gives a kernel that only
/// reads, the ceiling of generation, which reads every weight once per token.
pub fn read_bandwidth(threads: usize) -> f64 {
    const WORDS: usize = 32 << 20;
    let threads = threads.max(1);
    let part = WORDS.div_ceil(threads);
    // Written first (by the threads that read it, so their pages are local): untouched
    // pages would all map the zero page and read from cache.
    let mut buf = vec![0u64; WORDS];
    std::thread::scope(|s| {
        for (i, c) in buf.chunks_mut(part).enumerate() {
            s.spawn(move || {
                for (j, w) in c.iter_mut().enumerate() {
                    *w = (i * part + j) as u64;
                }
            });
        }
    });
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(part)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &w| a.wrapping_add(w))))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(sum);
    }
    (WORDS * 8) as f64 / best
}

/// One line per generation result: the weight-read bandwidth reached and, with a
/// `probe` (bytes per second from [`read_bandwidth`] with the same threads: weights in
/// host memory), its fraction of it.
pub fn bandwidth_lines(results: &[BenchResult], probe: Option<f64>, threads: usize) -> String {
    let mut s = String::new();
    for r in results.iter().filter(|r| r.weight_bytes_per_token > 0.0) {
        let bw = r.weight_read_bandwidth();
        s.push_str(&format!(
            "{}: {:.1} MB of weights per token at {:.2} t/s = {:.2} GB/s",
            r.test,
            r.weight_bytes_per_token / 1e6,
            r.tps_mean,
            bw / 1e9,
        ));
        s.push_str(&match probe {
            Some(p) => format!(
                ", {:.0} % of the {:.2} GB/s {threads} thread(s) read streaming (probe)\n",
                100.0 * bw / p,
                p / 1e9
            ),
            None => " (weights in GPU memory: the host read probe does not apply)\n".into(),
        });
    }
    s
}

/// Per-token traffic and host syncs between two snapshots of the scheduler's statistics.
fn per_token(
    before: Option<ggml_sched::Stats>,
    after: Option<ggml_sched::Stats>,
    tokens: usize,
) -> (f64, f64) {
    match (before, after) {
        (Some(a), Some(b)) if tokens > 0 => {
            let n = tokens as f64;
            let syncs = (b.host_syncs - a.host_syncs) + (b.host_reads - a.host_reads);
            (
                (b.bytes_copied - a.bytes_copied) as f64 / n,
                syncs as f64 / n,
            )
        }
        _ => (0.0, 0.0),
    }
}

fn summarize(test: String, n_tokens: usize, samples: Vec<f64>) -> BenchResult {
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let var = if samples.len() > 1 {
        samples.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    BenchResult {
        test,
        n_tokens,
        tps_mean: mean,
        tps_stddev: var.sqrt(),
        samples,
        bytes_moved_per_token: 0.0,
        host_syncs_per_token: 0.0,
        weight_bytes_per_token: 0.0,
        cuda_host: None,
    }
}

/// Token `i` of the benchmark's token sequence.
pub(crate) fn bench_token(model: &Model, i: usize) -> u32 {
    tokens(i + 1, model.hp.n_vocab)
        .last()
        .expect("i + 1 tokens")
}

/// The batch of a pp test: `n_prompt` tokens of one sequence, logits of the last.
pub(crate) fn prompt_batch(model: &Model, n_prompt: usize) -> Batch {
    let mut batch = Batch::default();
    for (i, t) in tokens(n_prompt, model.hp.n_vocab).enumerate() {
        batch.push(t, i as i32, 0, i + 1 == n_prompt);
    }
    batch
}

/// Time per kind of op of one test on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct OpProfile {
    /// `pp512`, `tg128`.
    pub test: String,
    /// The device's name (`cpu#0`, `cuda:0#0`).
    pub device: String,
    /// Wall time of the test's run, ms.
    pub wall_ms: f64,
    /// Per op, longest first.
    pub ops: Vec<ggml_core::OpTime>,
}

/// One pp run (`n_prompt` > 0) and one tg run (`n_gen` > 0) with op timing on in
/// `devices`: where each device spent the run. Run it after the benchmark: timing costs
/// a little per node, so these runs are not the ones whose speed is reported.
pub fn op_profile(
    model: &Model,
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    devices: &[TimedBackend<'_>],
    n_prompt: usize,
    n_gen: usize,
) -> Result<Vec<OpProfile>> {
    let timing = |on: bool| -> Result<()> {
        for d in devices {
            d.set_op_timing(on)?;
        }
        Ok(())
    };
    let mut out = Vec::new();
    let mut collect = |test: String, wall: f64| -> Result<()> {
        for d in devices {
            out.push(OpProfile {
                test: test.clone(),
                device: d.name(),
                wall_ms: wall * 1e3,
                ops: d.take_op_times()?,
            });
        }
        Ok(())
    };
    timing(true)?;
    let run = (|| -> Result<()> {
        if n_prompt > 0 {
            let batch = prompt_batch(model, n_prompt);
            kv.clear();
            let t = Instant::now();
            exec.forward(model, kv, &batch)?;
            collect(format!("pp{n_prompt}"), t.elapsed().as_secs_f64())?;
        }
        if n_gen > 0 {
            kv.clear();
            let t = Instant::now();
            for (i, tok) in tokens(n_gen, model.hp.n_vocab).enumerate() {
                let mut b = Batch::default();
                b.push(tok, i as i32, 0, true);
                exec.forward(model, kv, &b)?;
            }
            collect(format!("tg{n_gen}"), t.elapsed().as_secs_f64())?;
        }
        Ok(())
    })();
    timing(false)?;
    run.map(|()| out)
}

/// The op profiles as Markdown: per test and device, each op's calls, summed time,
/// share of the timed total and time per call, then the timed total against the wall.
pub fn op_profile_table(profiles: &[OpProfile]) -> String {
    let mut s = String::new();
    for p in profiles {
        let total: f64 = p.ops.iter().map(|o| o.ms).sum();
        s.push_str(&format!(
            "\n{} on {}: {:.2} ms in timed ops, {:.2} ms wall\n\n| op | calls | ms | share | µs/call |\n|---|---|---|---|---|\n",
            p.test, p.device, total, p.wall_ms
        ));
        for o in &p.ops {
            s.push_str(&format!(
                "| {o} | {} | {:.3} | {:.1} % | {:.2} |\n",
                o.calls,
                o.ms,
                if total > 0.0 {
                    100.0 * o.ms / total
                } else {
                    0.0
                },
                1e3 * o.ms / o.calls.max(1) as f64
            ));
        }
    }
    s
}

/// Token ids that exist in any vocabulary of `n_vocab` tokens (llama-bench uses random
/// tokens; content does not change the work done).
fn tokens(n: usize, n_vocab: usize) -> impl Iterator<Item = u32> {
    (0..n).map(move |i| ((i * 7919 + 13) % n_vocab) as u32)
}

/// How many times a test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runs {
    /// Timed repetitions (at least 1).
    pub reps: usize,
    /// One untimed run first (llama-bench's default; `--no-warmup` turns it off).
    pub warmup: bool,
}

impl Runs {
    /// The runs' indices: 0 is the warm-up (absent without one), 1..=reps the timed ones.
    fn indices(self) -> std::ops::RangeInclusive<usize> {
        usize::from(!self.warmup)..=self.reps
    }
}

/// Runs `pass` (`n_tokens` tokens into an emptied cache) once to warm up (unless
/// `runs.warmup` is off) and then `runs.reps` times: the timed passes' tokens per
/// second, and the scheduler's statistics and the CUDA devices' host counters from before
/// the first timed pass. Both counts must be at least 1 (each comes with its command-line
/// flag, for the error).
fn timed_reps(
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    (runs, reps_flag): (Runs, &str),
    (n_tokens, tokens_flag): (usize, &str),
    cuda: &[&ggml_cuda::CudaBackend],
    mut pass: impl FnMut(&mut dyn Executor, &mut KvCache) -> Result<()>,
) -> Result<(Vec<f64>, Option<ggml_sched::Stats>, ggml_cuda::HostCounters)> {
    let reps = runs.reps;
    if n_tokens == 0 || reps == 0 {
        return Err(HarnessError::Usage(format!(
            "{tokens_flag} and {reps_flag} must be at least 1"
        )));
    }
    let mut samples = Vec::with_capacity(reps);
    let mut before = None;
    let mut host_before = ggml_cuda::HostCounters::default();
    for rep in runs.indices() {
        kv.clear();
        if rep == 1 {
            before = exec.sched_stats();
            host_before = host_counters(cuda);
        }
        let t = Instant::now();
        pass(exec, kv)?;
        if rep > 0 {
            samples.push(n_tokens as f64 / t.elapsed().as_secs_f64());
        }
    }
    Ok((samples, before, host_before))
}

/// Prompt processing: one batch of `n_prompt` tokens into an empty cache, `runs.reps`
/// times after one warm-up run (if `runs.warmup`). `cuda` (the session's CUDA devices)
/// gives the host counters per pass.
pub fn bench_pp(
    model: &Model,
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    n_prompt: usize,
    runs: Runs,
    cuda: &[&ggml_cuda::CudaBackend],
) -> Result<BenchResult> {
    let reps = runs.reps;
    let batch = prompt_batch(model, n_prompt);
    let (samples, before, host_before) = timed_reps(
        exec,
        kv,
        (runs, "-r"),
        (n_prompt, "-p"),
        cuda,
        |exec, kv| {
            exec.forward(model, kv, &batch)?;
            Ok(())
        },
    )?;
    let mut r = summarize(format!("pp{n_prompt}"), n_prompt, samples);
    (r.bytes_moved_per_token, r.host_syncs_per_token) =
        per_token(before, exec.sched_stats(), n_prompt * reps);
    r.cuda_host =
        (!cuda.is_empty()).then(|| CudaHostCounts::per(&(host_counters(cuda) - host_before), reps));
    Ok(r)
}

/// Generation: `n_gen` single-token decodes after an empty context, `runs.reps` times
/// after one warm-up run (if `runs.warmup`). `cuda` (the session's CUDA devices) gives
/// the host counters per generated token.
pub fn bench_tg(
    model: &Model,
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    n_gen: usize,
    runs: Runs,
    cuda: &[&ggml_cuda::CudaBackend],
) -> Result<BenchResult> {
    let reps = runs.reps;
    let toks: Vec<u32> = tokens(n_gen, model.hp.n_vocab).collect();
    let (samples, before, host_before) =
        timed_reps(exec, kv, (runs, "-r"), (n_gen, "-n"), cuda, |exec, kv| {
            for (i, &tok) in toks.iter().enumerate() {
                let mut b = Batch::default();
                b.push(tok, i as i32, 0, true);
                exec.forward(model, kv, &b)?;
            }
            Ok(())
        })?;
    let mut r = summarize(format!("tg{n_gen}"), n_gen, samples);
    r.weight_bytes_per_token = model.weight_bytes_per_token() as f64;
    (r.bytes_moved_per_token, r.host_syncs_per_token) =
        per_token(before, exec.sched_stats(), n_gen * reps);
    r.cuda_host = (!cuda.is_empty())
        .then(|| CudaHostCounts::per(&(host_counters(cuda) - host_before), n_gen * reps));
    Ok(r)
}

/// A Markdown table like llama-bench's.
pub fn table(model_name: &str, threads: usize, devices: &str, results: &[BenchResult]) -> String {
    let mut s = String::from(
        "| model | threads | devices | test | t/s | bytes moved/token | host syncs/token |\n|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        s.push_str(&format!(
            "| {model_name} | {threads} | {devices} | {} | {:.2} ± {:.2} | {:.0} | {:.2} |\n",
            r.test, r.tps_mean, r.tps_stddev, r.bytes_moved_per_token, r.host_syncs_per_token
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::Runs;

    /// A warm-up is one untimed run (index 0) before the timed ones; without it only the
    /// timed runs happen, so two runs differ by exactly their repetitions.
    #[test]
    fn runs_are_the_warm_up_then_the_timed_ones() {
        let with = Runs {
            reps: 2,
            warmup: true,
        };
        assert_eq!(with.indices().collect::<Vec<_>>(), [0, 1, 2]);
        let without = Runs {
            reps: 2,
            warmup: false,
        };
        assert_eq!(without.indices().collect::<Vec<_>>(), [1, 2]);
        let one = Runs {
            reps: 1,
            warmup: false,
        };
        assert_eq!(one.indices().count(), 1);
    }
}
