//! Helpers several commands share: race reports, trace files, flag checks.

use harness::error::{HarnessError, Result};
use harness::session::Session;

/// Prints the races a checked session found; an error if there were any.
pub fn report_races(session: &Session) -> Result<usize> {
    let Some(log) = &session.race_log else {
        return Ok(0);
    };
    let n = log.race_count();
    if n > 0 {
        eprintln!("{}", log.summary(20));
    }
    Ok(n)
}

/// Writes the executor's trace to `path`, if one was asked for.
pub fn write_trace(
    exec: &mut dyn harness::executor::Executor,
    path: Option<&std::path::Path>,
) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    let trace = exec
        .take_trace()?
        .ok_or_else(|| HarnessError::Usage("--trace: this executor records no trace".into()))?;
    harness::trace::write_chrome(&trace, path)?;
    eprintln!(
        "trace: {} slices on {} queues and the host written to {p} (open in chrome://tracing or ui.perfetto.dev; summary: ggml-harness trace-summary {p})",
        trace.slices.len(),
        trace.queues.len(),
        p = path.display()
    );
    Ok(())
}

/// Checks a `--tflops` value: a positive number.
pub fn check_tflops(t: f64) -> Result<()> {
    if t.is_finite() && t > 0.0 {
        Ok(())
    } else {
        Err(HarnessError::Usage(format!(
            "--tflops {t}: must be positive"
        )))
    }
}
