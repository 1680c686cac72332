//! `ggml-harness generate`: a prompt continued, greedy or sampled.

use std::io::Write;
use std::path::PathBuf;

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
        let v = serde_json::json!({
            "prompt_tokens": g.prompt,
            "tokens": g.tokens,
            "text": String::from_utf8_lossy(&session.tokenizer.decode_bytes(&g.tokens)),
            "ended": g.ended,
            "prompt_tps": g.prompt_tokens_per_second(),
            "gen_tps": g.tokens_per_second(),
        });
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
    }
    if races > 0 {
        return Err(HarnessError::Usage(format!(
            "the happens-before checker found {races} races"
        )));
    }
    Ok(())
}
