//! Setup the cuda-sim integration tests share.

use cuda_sim::exec::{launch_profiled, LaunchConfig, LaunchError};
use cuda_sim::fault::Checks;
use cuda_sim::mem::FlatMemory;
use cuda_sim::profile::{LaunchCounters, ProfileOptions};
use cuda_sim::ptx::Module;

/// Kernel `k` of `m` on `blocks` blocks of `threads` threads (no dynamic shared memory),
/// on one host thread with the default profile: its counters.
pub fn profile_k(
    m: &Module,
    blocks: u32,
    threads: u32,
    args: &[&[u8]],
    mem: &FlatMemory,
    checks: Checks,
) -> Result<LaunchCounters, LaunchError> {
    let cfg = LaunchConfig {
        grid: [blocks, 1, 1],
        block: [threads, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    let (_, c) = launch_profiled(
        m,
        "k",
        &cfg,
        args,
        mem,
        checks,
        1,
        &ProfileOptions::default(),
    )?;
    Ok(c)
}
