//! `ggml-harness generate`: a prompt continued, greedy or sampled.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use harness::error::{HarnessError, Result};
use harness::session::Session;

use super::common::report_races;
use super::run_args::RunArgs;

/// The flags of `ggml-harness generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// GGUF model or a known model's name (default: the cached SmolLM2).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt (BOS is added where the vocabulary adds it).
    #[arg(short = 'p', long)]
    prompt: String,
    /// Tokens to generate at most (stops early at end of generation).
    #[arg(short = 'n', long, default_value_t = 64)]
    n_predict: usize,
    /// Temperature (0: greedy, the default).
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Keep the most likely tokens up to this probability mass (1: all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the random draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the generated token ids (one JSON object) instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Read back every pass's logits (also when greedy, where a GPU would return only the
    /// best token) and report, per generated token, its logit minus the runner-up's:
    /// `gaps` in the JSON, the smallest on stderr otherwise. A small gap is a near tie,
    /// which kernels of another summation order may decide the other way.
    #[arg(long)]
    gaps: bool,
    /// Compare the greedy tokens with another run's `--json --gaps` output of the same
    /// prompt (e.g. on other kernels or another device) and fail unless they are the same
    /// up to the first near tie: a first different token where either run's best logit
    /// was less than `--near-tie` above the runner-up. Implies `--gaps`.
    #[arg(long, value_name = "JSON")]
    against: Option<PathBuf>,
    /// The near-tie bound of `--against`, in logits.
    #[arg(long, default_value_t = 0.05, requires = "against")]
    near_tie: f32,
    #[command(flatten)]
    run: RunArgs,
}

/// Runs `ggml-harness generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    let config = a.run.config()?;
    let session = Session::open(&harness::model_path(a.model.as_deref())?, config)?;
    let mut sampler = harness::generate::Sampler::new(harness::generate::SamplerConfig {
        temp: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    })?;
    if a.against.is_some() && !sampler.is_greedy() {
        return Err(HarnessError::Usage(
            "--against compares greedy runs: leave --temp at 0".into(),
        ));
    }
    // Read before the run, so that a bad file fails before any work.
    let against = a.against.as_deref().map(read_greedy_run).transpose()?;
    if a.gaps || against.is_some() {
        sampler = sampler.record_gaps();
    }
    let n_prompt = session.tokenizer.encode(&a.prompt).len();
    let mut kv = session.kv_cache(n_prompt + a.n_predict)?;
    let mut exec = session.executor()?;
    let mut stdout = std::io::stdout().lock();
    // The runtime's error: the streaming callback returns it.
    let io = |source| harness::error::ModelError::Io {
        path: "<stdout>".into(),
        source,
    };
    if !a.json {
        stdout.write_all(a.prompt.as_bytes()).map_err(io)?;
        stdout.flush().map_err(io)?;
    }
    let g = harness::generate::generate(
        &session,
        exec.as_mut(),
        &mut kv,
        &a.prompt,
        a.n_predict,
        &mut sampler,
        |_, bytes| {
            if !a.json {
                stdout.write_all(bytes).map_err(io)?;
                stdout.flush().map_err(io)?;
            }
            Ok(())
        },
    )?;
    let races = report_races(&session)?;
    if a.json {
        let mut v = serde_json::json!({
            "prompt_tokens": g.prompt,
            "tokens": g.tokens,
            "text": String::from_utf8_lossy(&session.tokenizer.decode_bytes(&g.tokens)),
            "ended": g.ended,
            "prompt_tps": g.prompt_tokens_per_second(),
            "gen_tps": g.tokens_per_second(),
        });
        // Recorded with --gaps, or for --against (which implies it).
        if !g.gaps.is_empty() || a.gaps {
            v["gaps"] = serde_json::json!(g.gaps);
        }
        writeln!(stdout, "{v}").map_err(io)?;
    } else {
        writeln!(stdout).map_err(io)?;
        eprintln!(
            "prompt: {} tokens, {:.2} t/s; generated: {} tokens{}, {:.2} t/s",
            g.prompt.len(),
            g.prompt_tokens_per_second(),
            g.tokens.len(),
            if g.ended { " (end of generation)" } else { "" },
            g.tokens_per_second()
        );
        if let Some((i, gap)) = g.gaps.iter().enumerate().min_by(|x, y| x.1.total_cmp(y.1)) {
            eprintln!("smallest gap between the best and the second logit: {gap} (token {i})");
        }
    }
    if races > 0 {
        return Err(HarnessError::Usage(format!(
            "the happens-before checker found {races} races"
        )));
    }
    if let (Some(path), Some(other)) = (&a.against, &against) {
        compare_with(path, other, &g, a.near_tie)?;
    }
    Ok(())
}

/// The prompt, tokens and gaps of a `generate --json --gaps` output.
#[derive(serde::Deserialize)]
struct GreedyRun {
    #[serde(rename = "prompt_tokens")]
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    gaps: Vec<f32>,
}

fn read_greedy_run(path: &Path) -> Result<GreedyRun> {
    let bad = |why: String| HarnessError::Usage(format!("--against {}: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    if let Some(key) = ["prompt_tokens", "tokens", "gaps"]
        .into_iter()
        .find(|k| !v[k].is_array())
    {
        return Err(bad(format!(
            "no \"{key}\" list (written by `generate --json --gaps`?)"
        )));
    }
    let run: GreedyRun = serde_json::from_value(v).map_err(|e| bad(e.to_string()))?;
    if run.gaps.len() != run.tokens.len() {
        return Err(bad(format!(
            "{} gaps for {} tokens",
            run.gaps.len(),
            run.tokens.len()
        )));
    }
    Ok(run)
}

/// Prints how this run's greedy tokens compare with `other`'s; an error unless they are
/// the same up to the first near tie.
fn compare_with(
    path: &Path,
    other: &GreedyRun,
    g: &harness::generate::Generation,
    near_tie: f32,
) -> Result<()> {
    use harness::generate::{compare_greedy, GreedyAgreement};
    if other.prompt != g.prompt {
        return Err(HarnessError::Usage(format!(
            "--against {}: another prompt ({} tokens, this run {})",
            path.display(),
            other.prompt.len(),
            g.prompt.len()
        )));
    }
    let name = path.display();
    match compare_greedy([&g.tokens, &other.tokens], [&g.gaps, &other.gaps], near_tie) {
        GreedyAgreement::Same { n } => {
            eprintln!("against {name}: the same {n} greedy tokens");
            Ok(())
        }
        GreedyAgreement::NearTie { at, gaps } => {
            eprintln!(
                "against {name}: the same {at} greedy tokens, then a near tie decided \
                 differently (token {at}: best minus runner-up {} here, {} there; bound \
                 {near_tie})",
                gaps[0], gaps[1]
            );
            Ok(())
        }
        GreedyAgreement::Differs { at, gaps } => Err(HarnessError::Usage(format!(
            "against {name}: greedy token {at} differs ({} here, {} there) where neither \
             run was near a tie (best minus runner-up {} here, {} there; bound {near_tie})",
            g.tokens[at], other.tokens[at], gaps[0], gaps[1]
        ))),
    }
}
