//! `ggml-harness cost-model`: the modelled copy time of the tensor split's all-gathers.

use clap::Args;
use harness::error::{HarnessError, Result};

use super::common::check_tflops;

/// The flags of `ggml-harness cost-model`.
#[derive(Args, Debug)]
pub struct CostModelArgs {
    /// Width of the residual stream (SmolLM2: 576, Llama 3 8B: 4096).
    #[arg(long)]
    n_embd: usize,
    /// Width of the attention heads together (default: n_embd).
    #[arg(long)]
    n_q: Option<usize>,
    /// Width of the FFN (SmolLM2: 1536, Llama 3 8B: 14336).
    #[arg(long)]
    n_ff: usize,
    /// Tokens of the pass.
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    /// Device counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    devices: Vec<usize>,
    /// Product speed per device.
    #[arg(long, default_value_t = 400.0, value_name = "TFLOPS")]
    tflops: f64,
}

/// Runs `ggml-harness cost-model`.
pub fn run(a: CostModelArgs) -> Result<()> {
    check_tflops(a.tflops)?;
    if a.n_embd == 0 || a.n_ff == 0 || a.tokens == 0 || a.n_q == Some(0) {
        return Err(HarnessError::Usage(
            "--n-embd, --n-q, --n-ff and --tokens must be at least 1".into(),
        ));
    }
    if a.devices.contains(&0) {
        return Err(HarnessError::Usage(
            "--devices: counts must be at least 1".into(),
        ));
    }
    let gathers =
        harness::cost::layer_gathers(a.n_embd, a.n_q.unwrap_or(a.n_embd), a.n_ff, a.tokens);
    print!(
        "{}",
        harness::cost::table(&gathers, &a.devices, &harness::cost::LINKS, a.tflops * 1e12)
    );
    Ok(())
}
