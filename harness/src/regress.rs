//! One cell of a regression matrix: perplexity on given devices, split mode, pipeline
//! slots and threads (the matrices themselves live in [`crate::matrix`]).

use std::path::Path;
use std::time::Instant;

use crate::devices::DeviceList;
use crate::error::Result;
use crate::perplexity::{perplexity, PplSettings};
use crate::session::{AllGather, RunConfig, Session, SplitMode};

/// One cell of the matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// Devices.
    pub devices: DeviceList,
    /// Split mode.
    pub split: SplitMode,
    /// Pipeline slots.
    pub n_copies: usize,
    /// Threads in total.
    pub threads: usize,
    /// Tokens per micro-batch (0: the whole batch).
    pub n_ubatch: usize,
    /// Tensor-reduce only: partial sums of at least this many bytes cross as BF16.
    pub reduce_bf16_min: Option<usize>,
    /// Tensor only: how activations are all-gathered.
    pub all_gather: AllGather,
}

impl Cell {
    /// The run configuration of the cell (no checker, chaos or weakened rules).
    pub fn config(&self) -> RunConfig {
        let mut config = RunConfig::simple(
            self.devices.clone(),
            self.split,
            self.n_copies,
            self.threads,
        );
        config.n_ubatch = self.n_ubatch;
        config.reduce_bf16_min = self.reduce_bf16_min;
        config.all_gather = self.all_gather;
        config
    }
}

/// What one cell measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CellResult {
    /// Devices.
    pub devices: String,
    /// Split mode.
    #[serde(serialize_with = "split_mode_name")]
    pub split_mode: SplitMode,
    /// Pipeline slots.
    pub n_copies: usize,
    /// Threads.
    pub threads: usize,
    /// Tokens per micro-batch (0: the whole batch).
    pub n_ubatch: usize,
    /// How activations are all-gathered (tensor split).
    #[serde(serialize_with = "all_gather_name")]
    pub all_gather: AllGather,
    /// Perplexity.
    pub ppl: f64,
    /// Its f64 bits in hex.
    pub ppl_f64_bits: String,
    /// SHA-256 of every scored logit.
    pub logits_sha256: String,
    /// Wall time of the cell.
    pub seconds: f64,
    /// Host syncs per forward pass (from the scheduler).
    pub host_syncs_per_forward: f64,
    /// Races the checker found (0 when not checking).
    pub races: usize,
}

/// A split mode in reports: its command-line name.
fn split_mode_name<S: serde::Serializer>(
    m: &SplitMode,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(m.name())
}

/// An all-gather in reports: its command-line name.
fn all_gather_name<S: serde::Serializer>(
    a: &AllGather,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(a.name())
}

/// Settings shared by every cell.
#[derive(Clone, Debug)]
pub struct RegressSettings {
    /// Perplexity settings.
    pub ppl: PplSettings,
    /// Check races in every cell.
    pub check_races: bool,
    /// Chaos seed (each cell uses it).
    pub chaos: Option<u64>,
    /// Scheduler rules weakened on purpose (to watch the checker catch them).
    pub weaken: Vec<ggml_sched::WeakenKnob>,
}

/// Runs one cell.
pub fn run_cell(model: &Path, text: &str, cell: &Cell, s: &RegressSettings) -> Result<CellResult> {
    let t0 = Instant::now();
    let mut config = cell.config();
    config.check_races = s.check_races;
    config.chaos = s.chaos;
    config.weaken = s.weaken.clone();
    let session = Session::open(model, config)?;
    let tokens = session.tokenizer.encode(text);
    let bos = session
        .tokenizer
        .add_bos()
        .then(|| session.tokenizer.bos())
        .flatten();
    let n_seq = (s.ppl.n_batch / s.ppl.n_ctx).max(1);
    let mut kv = session.kv_cache(s.ppl.n_ctx * n_seq)?;
    let mut exec = session.executor()?;
    let r = perplexity(
        &session.model,
        exec.as_mut(),
        &mut kv,
        &tokens,
        bos,
        s.ppl,
        |_, _, _| {},
    )?;
    let races = session.race_log.as_ref().map_or(0, |l| l.race_count());
    if races > 0 {
        if let Some(l) = &session.race_log {
            eprintln!("{}", l.summary(10));
        }
    }
    Ok(CellResult {
        devices: cell.devices.to_string(),
        split_mode: cell.split,
        n_copies: cell.n_copies,
        threads: cell.threads,
        n_ubatch: cell.n_ubatch,
        all_gather: cell.all_gather,
        ppl: r.ppl,
        ppl_f64_bits: format!("{:016x}", r.ppl.to_bits()),
        logits_sha256: r.logits_sha256,
        seconds: t0.elapsed().as_secs_f64(),
        host_syncs_per_forward: exec.host_syncs_per_forward().unwrap_or(0.0),
        races,
    })
}
