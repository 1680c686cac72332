//! `ggml-harness profile`: a model's prompt pass and generated token on cuda-sim, every
//! launch counted (instructions by class, memory sectors, DRAM traffic through the named
//! GPU's L2, bank conflicts, the critical path) and priced by cuda-sim's cost model for
//! that GPU. The times are **modelled**, never measured: they say where a pass should
//! spend its time and how a kernel change moves it; a GPU run of the calibration kit
//! says how far the model is from the hardware.
//!
//! The real SmolLM2 is too large to interpret whole in minutes, so each launch can be
//! sampled ([`ProfileSettings::sample_blocks`]): at most that many evenly spaced blocks
//! run and the counts are scaled (the kernels' results are then meaningless, so the
//! profile never checks them). `tests/profile.rs` measures what sampling changes on the
//! synthetic model against an unsampled run.

use std::collections::BTreeMap;

use ggml_core::Backend;
use ggml_cuda::cuda_sim::cost::{
    self, GpuSpec, KernelResources, LaunchKind, Prediction, ResourceTable,
};
use ggml_cuda::cuda_sim::driver::ProfileConfig;
use ggml_cuda::cuda_sim::profile::LaunchCounters;
use ggml_cuda::{CudaBackend, KernelId};
use serde_json::{json, Value};

use crate::batch::Batch;
use crate::error::{HarnessError, Result};
use crate::executor::Executor;
use crate::model::Model;
use crate::placement::KvCache;

/// How to profile.
#[derive(Clone, Debug)]
pub struct ProfileSettings {
    /// The GPU whose L2 the DRAM traffic goes through and whose constants price it.
    pub gpu: GpuSpec,
    /// Interpret at most this many blocks of each launch (`None`: all).
    pub sample_blocks: Option<u64>,
    /// Prompt tokens of the prompt pass.
    pub n_prompt: usize,
    /// Tokens the generation figure is for (each modelled as the one decoded token at
    /// [`Self::gen_position`]: a generation of up to 128 tokens attends the same 128 KV
    /// cells, one [`ggml_model::batch::KV_PAD`], at every step).
    pub n_gen: usize,
    /// The position of the decoded token: the cache first holds that many tokens (a
    /// prompt pass that is not profiled), so its attention reads that many positions. 0:
    /// the first token of a generation; 64: the mean of a 128-token one.
    pub gen_position: usize,
    /// How the kernels are launched: graph nodes when the backend replays CUDA graphs.
    pub launch: LaunchKind,
    /// Keep each launch's critical-warp cycles by PTX line ([`stall_report`]).
    pub stall_lines: bool,
}

/// One launch of a profiled pass.
#[derive(Clone, Debug)]
pub struct ProfiledLaunch {
    /// `pp512`, `tg`.
    pub pass: String,
    /// Its position in the pass on its device.
    pub index: usize,
    /// The device's index among the CUDA devices.
    pub device: usize,
    /// The node it computes (the first one, for a fused launch).
    pub node: String,
    /// Op and weight type, as op timing keys them.
    pub op: ggml_core::OpKey,
    /// The kernel.
    pub kernel: KernelId,
    /// Multiply-adds of a product or attention (0 otherwise).
    pub macs: u64,
    /// What cuda-sim counted.
    pub counters: LaunchCounters,
    /// The kernel's `ptxas -v` resources on the GPU's architecture.
    pub resources: Option<KernelResources>,
    /// The cost model's time for it, alone.
    pub prediction: Prediction,
    /// Launched with programmatic stream serialisation (programmatic dependent launch).
    pub programmatic: bool,
    /// The part of `prediction.time_s` that runs while the launch before it on its
    /// device still runs ([`Prediction::programmatic_overlap_s`]; 0 unless
    /// `programmatic`).
    pub hidden_s: f64,
}

impl ProfiledLaunch {
    /// Modelled seconds it adds to its pass: its time less what overlaps the launch
    /// before it.
    pub fn modelled_s(&self) -> f64 {
        self.prediction.time_s - self.hidden_s
    }

    /// `MUL_MAT q4_1`, `ADD`.
    pub fn op_name(&self) -> String {
        match self.op.1 {
            Some(w) => format!("{} {w}", self.op.0),
            None => self.op.0.to_string(),
        }
    }
}

/// The PTX architecture whose `ptxas -v` resources price a GPU (the table has sm_80 and
/// sm_90; newer GPUs run the sm_90 code).
fn arch_of(gpu: &GpuSpec) -> &'static str {
    if gpu.arch.compute_capability < 90 {
        "sm_80"
    } else {
        "sm_90"
    }
}

/// Runs `pass` with every launch of `backends` (cuda-sim devices) counted and priced.
pub fn profile_pass(
    backends: &[&CudaBackend],
    name: &str,
    settings: &ProfileSettings,
    pass: impl FnOnce() -> Result<()>,
) -> Result<Vec<ProfiledLaunch>> {
    if backends.is_empty()
        || backends
            .iter()
            .any(|b| b.driver_kind() != ggml_cuda::DriverKind::Sim)
    {
        return Err(HarnessError::Usage(
            "profile counts what cuda-sim executes: give --devices cuda-sim:N".into(),
        ));
    }
    let drv = ggml_cuda::sim_driver().map_err(|e| HarnessError::Model(e.to_string()))?;
    let table = ResourceTable::parse(ggml_cuda::kernels::PTXAS_RESOURCES)
        .map_err(|e| HarnessError::Model(format!("ptxas resource table: {e}")))?;
    drv.enable_profiling(ProfileConfig {
        gpu: settings.gpu.clone(),
        sample_blocks: settings.sample_blocks,
        stall_lines: settings.stall_lines,
    });
    drv.take_launch_records();
    drv.reset_l2();
    for b in backends {
        b.record_launches(true);
    }
    let ran = pass().and_then(|()| {
        for b in backends {
            b.synchronize()?;
        }
        Ok(())
    });
    let records = drv.take_launch_records();
    drv.disable_profiling();
    let recorded: Vec<_> = backends
        .iter()
        .map(|b| {
            let l = b.take_recorded_launches();
            b.record_launches(false);
            l
        })
        .collect();
    ran?;
    let arch = arch_of(&settings.gpu);
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let device = backends
            .iter()
            .position(|b| b.stream_handle() == r.stream.0);
        let (Some(device), Some(tag)) = (device, r.tag) else {
            return Err(HarnessError::Model(format!(
                "a launch of {} that no backend recorded (stream {:?}, tag {:?})",
                r.kernel, r.stream, r.tag
            )));
        };
        let l = recorded[device].get(tag as usize).ok_or_else(|| {
            HarnessError::Model(format!("launch tag {tag} beyond the recorded launches"))
        })?;
        let (file, entry) = l.kernel.entry();
        // A variant of an entry compiled for one dtype and form (`qmm__...`) is priced
        // with the generic entry's ptxas resources (it has fewer registers; the model has
        // no term for the instruction fetch it saves).
        let variant = r
            .kernel
            .strip_prefix(entry)
            .is_some_and(|rest| rest.starts_with("__"));
        if entry != r.kernel && !variant {
            return Err(HarnessError::Model(format!(
                "launch {tag} recorded as {entry} but cuda-sim ran {}",
                r.kernel
            )));
        }
        let res = table.get(file, entry, arch);
        let prediction = cost::predict(&settings.gpu, &r.counters, res.as_ref(), settings.launch)
            .map_err(|e| HarnessError::Model(format!("{entry}: {e}")))?;
        out.push(ProfiledLaunch {
            pass: name.to_string(),
            index: tag as usize,
            device,
            node: l.node.as_str().to_string(),
            op: l.op,
            kernel: l.kernel,
            macs: l.macs,
            counters: r.counters,
            resources: res,
            prediction,
            programmatic: r.programmatic,
            hidden_s: 0.0,
        });
    }
    hide_programmatic_prologues(&mut out);
    Ok(out)
}

/// Prices `launches` again with `gpu`'s constants, each as a launch of kind `launch`, and
/// their programmatic overlaps after them: what the same counters model under other
/// constants (a fit's).
pub fn reprice(launches: &mut [ProfiledLaunch], gpu: &GpuSpec, launch: LaunchKind) -> Result<()> {
    for l in launches.iter_mut() {
        l.prediction = cost::predict(gpu, &l.counters, l.resources.as_ref(), launch)
            .map_err(|e| HarnessError::Model(format!("{} ({}): {e}", l.node, l.op_name())))?;
        l.hidden_s = 0.0;
    }
    hide_programmatic_prologues(launches);
    Ok(())
}

/// Sets [`ProfiledLaunch::hidden_s`] of every programmatic launch from the launch before
/// it in the same pass on the same device (in launch order), as the GPU would overlap
/// them. Indices count within a pass, so launches of different passes never pair.
fn hide_programmatic_prologues(launches: &mut [ProfiledLaunch]) {
    let mut order: Vec<usize> = (0..launches.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&launches[a], &launches[b]);
        (&a.pass, a.device, a.index).cmp(&(&b.pass, b.device, b.index))
    });
    for w in order.windows(2) {
        let (prev, this) = (w[0], w[1]);
        let (p, t) = (&launches[prev], &launches[this]);
        if t.programmatic && p.device == t.device && p.pass == t.pass {
            launches[this].hidden_s = launches[this]
                .prediction
                .programmatic_overlap_s(&launches[prev].prediction);
        }
    }
}

/// The two passes the figures are for: a prompt of `n_prompt` tokens into an empty
/// cache (`pp{n_prompt}`), then one token decoded at position
/// [`ProfileSettings::gen_position`] (`tg`; the tokens before it are computed first, not
/// profiled). `kv` holds at least `gen_position + 1` cells.
pub fn profile_model(
    model: &Model,
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    backends: &[&CudaBackend],
    settings: &ProfileSettings,
) -> Result<Vec<ProfiledLaunch>> {
    let mut out = Vec::new();
    if settings.n_prompt > 0 {
        let prompt = crate::bench::prompt_batch(model, settings.n_prompt);
        kv.clear();
        let name = format!("pp{}", settings.n_prompt);
        out.extend(profile_pass(backends, &name, settings, || {
            exec.forward(model, kv, &prompt)
                .map(|_| ())
                .map_err(Into::into)
        })?);
    }
    if settings.n_gen > 0 {
        kv.clear();
        let at = settings.gen_position;
        if at > 0 {
            let context = crate::bench::prompt_batch(model, at);
            exec.forward(model, kv, &context)?;
        }
        let mut one = Batch::default();
        one.push(crate::bench::bench_token(model, at), at as i32, 0, true);
        out.extend(profile_pass(backends, "tg", settings, || {
            exec.forward(model, kv, &one)
                .map(|_| ())
                .map_err(Into::into)
        })?);
    }
    Ok(out)
}

/// Per pass and op: launches, modelled µs, the counters summed.
#[derive(Clone, Debug, Default)]
pub struct OpRow {
    /// Launches.
    pub calls: usize,
    /// Modelled seconds.
    pub seconds: f64,
    /// Warp instructions.
    pub warp_instructions: u64,
    /// Thread instructions.
    pub thread_instructions: u64,
    /// DRAM bytes through the L2 model.
    pub dram_bytes: u64,
    /// Multiply-adds of products and attention, and those on tensor cores.
    pub macs: u64,
    /// Tensor-core multiply-adds.
    pub tensor_macs: u64,
    /// Modelled seconds by binding term.
    pub bound: BTreeMap<String, f64>,
}

impl OpRow {
    /// The term that bound most of the row's modelled time.
    pub fn main_bound(&self) -> &str {
        self.bound
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or("-", |(k, _)| k.as_str())
    }
}

/// The launches of `pass` summed per op (and weight type), longest first.
pub fn op_rows(launches: &[ProfiledLaunch], pass: &str) -> Vec<(String, OpRow)> {
    let mut rows: BTreeMap<String, OpRow> = BTreeMap::new();
    for l in launches.iter().filter(|l| l.pass == pass) {
        let r = rows.entry(l.op_name()).or_default();
        r.calls += 1;
        r.seconds += l.modelled_s();
        r.warp_instructions += l.counters.warp_instructions;
        r.thread_instructions += l.counters.thread_instructions;
        r.dram_bytes += cost::dram_bytes(&l.counters);
        r.macs += l.macs;
        r.tensor_macs += l.counters.tensor_macs;
        *r.bound.entry(l.prediction.bound.name()).or_default() += l.modelled_s();
    }
    let mut v: Vec<(String, OpRow)> = rows.into_iter().collect();
    v.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds).then(a.0.cmp(&b.0)));
    v
}

/// Modelled seconds of `pass`.
pub fn pass_seconds(launches: &[ProfiledLaunch], pass: &str) -> f64 {
    launches
        .iter()
        .filter(|l| l.pass == pass)
        .map(ProfiledLaunch::modelled_s)
        .sum()
}

/// The share of the products' and attention's multiply-adds done on tensor cores in
/// `pass` (0 when the pass has none): the multiply-adds of tensor-core instructions over
/// those plus the nominal multiply-adds of the launches that ran none.
///
/// A launch with tensor-core instructions counts what they did and nothing else: the
/// kernels that have them (`qgemm`, `flash_attn_mma`) do every product on them, and what
/// they skip is not done at all (attention's fully masked tiles: half of a causal prompt,
/// which the op's nominal count, every query times every KV position, includes). A launch
/// without them counts its op's nominal multiply-adds, an upper bound of what its FMA or
/// dp4a instructions did.
pub fn tensor_core_fraction(launches: &[ProfiledLaunch], pass: &str) -> f64 {
    let (mut all, mut tc) = (0u64, 0u64);
    for l in launches.iter().filter(|l| l.pass == pass) {
        let t = l.counters.tensor_macs;
        all += if t > 0 { t } else { l.macs };
        tc += t;
    }
    if all == 0 {
        0.0
    } else {
        tc as f64 / all as f64
    }
}

/// The per-op table of `pass` in the layout of harness/reference/cuda-h200.md, with the
/// counters beside the modelled times.
pub fn table(launches: &[ProfiledLaunch], pass: &str) -> String {
    let total = pass_seconds(launches, pass);
    let mut s = format!(
        "{pass}: {:.3} ms modelled\n\n| op | calls | ms (modelled) | share | µs/call | bound | DRAM MB | warp instr (M) | lanes |\n|---|---|---|---|---|---|---|---|---|\n",
        total * 1e3
    );
    for (op, r) in op_rows(launches, pass) {
        let lanes = if r.warp_instructions == 0 {
            0.0
        } else {
            r.thread_instructions as f64 / (32.0 * r.warp_instructions as f64)
        };
        s.push_str(&format!(
            "| {op} | {} | {:.3} | {:.1} % | {:.2} | {} | {:.2} | {:.2} | {:.2} |\n",
            r.calls,
            r.seconds * 1e3,
            100.0 * r.seconds / total.max(f64::MIN_POSITIVE),
            r.seconds * 1e6 / r.calls as f64,
            r.main_bound(),
            r.dram_bytes as f64 / 1e6,
            r.warp_instructions as f64 / 1e6,
            lanes
        ));
    }
    s
}

/// Where the critical path of each op's longest launch in `pass` spent its cycles, by
/// label region (the code from one PTX label to the next) and by line, the `top` lines
/// with their text: one issue cycle per instruction plus its wait for operands, along the
/// warp that ends the path and, before each barrier, the warp that reached it last;
/// priced at the profiling latencies.
/// Empty unless the launches were profiled with [`ProfileSettings::stall_lines`].
pub fn stall_report(launches: &[ProfiledLaunch], pass: &str, top: usize) -> String {
    let mut s = String::new();
    for (op, _) in op_rows(launches, pass) {
        let Some(l) = launches
            .iter()
            .filter(|l| l.pass == pass && l.op_name() == op)
            .max_by(|a, b| a.modelled_s().total_cmp(&b.modelled_s()))
        else {
            continue;
        };
        let stalls = &l.counters.critical_stalls;
        if stalls.is_empty() {
            continue;
        }
        let (file, entry) = l.kernel.entry();
        let source = ggml_cuda::kernels::MODULES
            .iter()
            .find(|m| m.file == file)
            .map_or("", |m| m.source);
        let lines: Vec<&str> = source.lines().collect();
        let text = |line: u32| {
            lines
                .get(line.saturating_sub(1) as usize)
                .map_or("", |t| t.trim())
        };
        let total: u64 = stalls.iter().map(|&(_, n)| n).sum();
        let pct = |n: u64| 100.0 * n as f64 / total.max(1) as f64;
        s.push_str(&format!(
            "{op}: {entry} ({file}), launch {} of {pass}, {total} cycles on the critical path \
             (modelled)\n",
            l.index
        ));
        let mut regions: Vec<(String, u64)> = Vec::new();
        for &(line, n) in stalls {
            let label = (1..=line)
                .rev()
                .map(text)
                .find(|t| is_label(t) || t.starts_with(".visible .entry") || t.starts_with(".func"))
                .unwrap_or("");
            let label = label.trim_end_matches(':').to_string();
            match regions.iter_mut().find(|(r, _)| *r == label) {
                Some((_, c)) => *c += n,
                None => regions.push((label, n)),
            }
        }
        regions.sort_by_key(|r| std::cmp::Reverse(r.1));
        let by_region: Vec<String> = regions
            .iter()
            .take(top)
            .map(|(r, n)| format!("{r} {n} ({:.0} %)", pct(*n)))
            .collect();
        s.push_str(&format!("  regions: {}\n", by_region.join(", ")));
        let mut by_line = stalls.clone();
        by_line.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for &(line, n) in by_line.iter().take(top) {
            s.push_str(&format!(
                "  {line:>5} {n:>7} {:>5.1} %  {}\n",
                pct(n),
                text(line)
            ));
        }
    }
    s
}

/// A PTX label line: `NAME:` alone.
fn is_label(t: &str) -> bool {
    t.strip_suffix(':').is_some_and(|n| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    })
}

/// The `--json` object: modelled speeds, per-op rows, every launch.
pub fn json(launches: &[ProfiledLaunch], settings: &ProfileSettings, extra: Value) -> Value {
    let pp = format!("pp{}", settings.n_prompt);
    let pp_s = pass_seconds(launches, &pp);
    let tg_s = pass_seconds(launches, "tg");
    let rate = |n: usize, s: f64| (s > 0.0).then(|| n as f64 / s);
    let mut modelled = serde_json::Map::new();
    modelled.insert(
        format!("pp{}_tps", settings.n_prompt),
        json!(rate(settings.n_prompt, pp_s)),
    );
    modelled.insert(format!("tg{}_tps", settings.n_gen), json!(rate(1, tg_s)));
    modelled.insert("pp_pass_ms".into(), json!(pp_s * 1e3));
    modelled.insert("tg_token_ms".into(), json!(tg_s * 1e3));
    let ops = |pass: &str| -> Vec<Value> {
        op_rows(launches, pass)
            .into_iter()
            .map(|(op, r)| {
                json!({
                    "pass": pass,
                    "op": op,
                    "calls": r.calls,
                    "modelled_us": r.seconds * 1e6,
                    "bound": r.main_bound(),
                    "warp_instructions": r.warp_instructions,
                    "thread_instructions": r.thread_instructions,
                    "dram_bytes": r.dram_bytes,
                    "macs": r.macs,
                    "tensor_macs": r.tensor_macs,
                })
            })
            .collect()
    };
    let mut all_ops = ops(&pp);
    all_ops.extend(ops("tg"));
    let rows: Vec<Value> = launches
        .iter()
        .map(|l| {
            let c = &l.counters;
            json!({
                "pass": l.pass,
                "index": l.index,
                "device": l.device,
                "node": l.node,
                "op": l.op.0,
                "weights": l.op.1,
                "kernel": l.kernel.entry().1,
                "grid": c.grid,
                "block": c.block,
                "modelled_us": l.modelled_s() * 1e6,
                "alone_us": l.prediction.time_s * 1e6,
                "programmatic": l.programmatic,
                "hidden_us": l.hidden_s * 1e6,
                "bound": l.prediction.bound.name(),
                "warp_instructions": c.warp_instructions,
                "lane_utilisation": c.lane_utilisation(),
                "dram_bytes": cost::dram_bytes(c),
                "global_load_sectors": c.global_load.sectors,
                "global_store_sectors": c.global_store.sectors,
                "shared_wavefronts": c.shared_load.wavefronts + c.shared_store.wavefronts,
                "macs": l.macs,
                "tensor_macs": c.tensor_macs,
                "sampled": c.sampled(),
                "critical_stalls": c.critical_stalls,
                "critical_path": {
                    "cycles": c.critical_path_cycles,
                    "issue": c.critical_path.issue,
                    "alu": c.critical_path.alu,
                    "special": c.critical_path.special,
                    "shared": c.critical_path.shared,
                    "global": c.critical_path.global,
                    "barriers": c.barriers,
                },
            })
        })
        .collect();
    json!({
        "gpu": settings.gpu.name,
        "sample_blocks": settings.sample_blocks,
        "launch": match settings.launch { LaunchKind::Stream => "stream", LaunchKind::GraphNode => "graph_node" },
        "modelled": Value::Object(modelled),
        "tensor_core_fraction": { "pp": tensor_core_fraction(launches, &pp), "tg": tensor_core_fraction(launches, "tg") },
        "ops": all_ops,
        "launches": rows,
        "run": extra,
    })
}
