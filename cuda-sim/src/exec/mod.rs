//! The interpreter: runs one kernel launch over its grid.
//!
//! Each block's threads form warps of 32 lanes. A warp executes one decoded
//! instruction for all lanes that share the lowest program counter (min-PC
//! scheduling): divergent lanes wait, and reconverge where their paths meet, which is
//! deterministic and matches structured control flow on a GPU. Calls run the callee for
//! the calling lanes in a frame of its own. A block's warps run one after another up to
//! each `bar.sync`; blocks run in parallel on host threads, and no result depends on how
//! many.
//!
//! Arithmetic is bit-exact to the PTX ISA for the exact instructions; see `arith` for
//! the `.approx` results and the choices where the ISA leaves a value unspecified
//! (division by zero: all ones; remainder by zero: the dividend; f32 NaN results: the
//! canonical `0x7fffffff`; f64 NaN results without a NaN operand: `0xfff8000000000000`,
//! narrowed to f32 as `0xffc00000`, as an H200 gives them).

pub(crate) mod arith;
pub(crate) mod bits;
mod engine;
pub(crate) mod half;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{CuError, ErrorCode};
use crate::fault::{Checks, KernelFault};
use crate::mem::GlobalMemory;
use crate::profile::collect::Collector;
use crate::profile::{LaunchCounters, ProfileOptions};
use crate::ptx::Module;

pub use arith::{CANONICAL_NAN_F32, DEFAULT_NAN_F64};

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Bytes of dynamic (`.extern .shared`) shared memory per block.
    pub dynamic_shared: u32,
    /// Launched with programmatic stream serialisation (`cuLaunchKernelEx`'s
    /// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`): the grid may start while
    /// the one before it finishes, so no thread may touch global memory before its
    /// `griddepcontrol.wait` (a racecheck fault here).
    pub programmatic: bool,
}

/// What a launch executed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchStats {
    /// Instructions issued per warp, summed over warps (one per active group step).
    pub warp_instructions: u64,
    /// Instructions executed per thread, summed over threads.
    pub thread_instructions: u64,
}

/// Why a launch failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LaunchError {
    /// The launch itself is invalid (unknown kernel, wrong argument count or size, zero
    /// or too large dimensions, too much shared memory): nothing ran.
    /// `CUDA_ERROR_INVALID_VALUE`, `NOT_FOUND` or `LAUNCH_OUT_OF_RESOURCES`.
    Invalid(CuError),
    /// A thread faulted or a check failed; the first one found (by block index order
    /// among the blocks that ran) is reported.
    Fault(Box<KernelFault>),
}

/// Most threads per block.
pub const MAX_THREADS: u32 = 1024;
/// Most shared memory per block, static and dynamic (sm_80 with the opt-in attribute).
pub const MAX_SHARED: usize = 227 << 10;

/// A launch checked by [`prepare`]: the kernel's index, its packed parameter block and
/// the shared memory per block.
struct Prepared {
    entry: usize,
    packed: Vec<u8>,
    shared_bytes: usize,
}

/// Checks a launch as [`launch`] does before running anything: the kernel exists, the
/// arguments match its parameters, the dimensions and the shared memory are within the
/// device's limits. The error is what [`launch`] would return.
pub fn check_launch(
    module: &Module,
    kernel: &str,
    cfg: &LaunchConfig,
    args: &[&[u8]],
) -> Result<(), LaunchError> {
    prepare(module, kernel, cfg, args).map(|_| ())
}

fn prepare(
    module: &Module,
    kernel: &str,
    cfg: &LaunchConfig,
    args: &[&[u8]],
) -> Result<Prepared, LaunchError> {
    let invalid = |code: ErrorCode, why: String| Err(LaunchError::Invalid(CuError::new(code, why)));
    let Some(entry) = module
        .functions
        .iter()
        .position(|f| f.is_entry && f.name == kernel)
    else {
        return invalid(
            ErrorCode::NotFound,
            format!("no kernel '{kernel}' in {}", module.file),
        );
    };
    let f = &module.functions[entry];
    if args.len() != f.kernel_params.len() {
        return invalid(
            ErrorCode::InvalidValue,
            format!(
                "{kernel} takes {} arguments, {} given",
                f.kernel_params.len(),
                args.len()
            ),
        );
    }
    let mut packed = vec![0u8; f.kernel_param_bytes];
    for (i, (p, a)) in f.kernel_params.iter().zip(args).enumerate() {
        if a.len() < p.size {
            return invalid(
                ErrorCode::InvalidValue,
                format!(
                    "{kernel}: argument {i} ('{}') has {} bytes, needs {}",
                    p.name,
                    a.len(),
                    p.size
                ),
            );
        }
        let off = f.kernel_param_offsets[i];
        packed[off..off + p.size].copy_from_slice(&a[..p.size]);
    }
    let [gx, gy, gz] = cfg.grid;
    let [bx, by, bz] = cfg.block;
    if gx == 0
        || gy == 0
        || gz == 0
        || bx == 0
        || by == 0
        || bz == 0
        || gy > 65535
        || gz > 65535
        || gx > i32::MAX as u32
    {
        return invalid(
            ErrorCode::InvalidValue,
            format!("{kernel}: grid {:?} block {:?}", cfg.grid, cfg.block),
        );
    }
    if bx as u64 * by as u64 * bz as u64 > MAX_THREADS as u64 || bz > 64 {
        return invalid(
            ErrorCode::InvalidValue,
            format!(
                "{kernel}: block {:?} has more than {MAX_THREADS} threads",
                cfg.block
            ),
        );
    }
    let shared_bytes = match module.extern_shared {
        Some(off) => off + cfg.dynamic_shared as usize,
        None => module.shared_bytes,
    };
    if shared_bytes > MAX_SHARED {
        return invalid(
            ErrorCode::LaunchOutOfResources,
            format!("{kernel}: {shared_bytes} bytes of shared memory per block"),
        );
    }
    Ok(Prepared {
        entry,
        packed,
        shared_bytes,
    })
}

/// Runs kernel `kernel` of `module` over the grid. `args` holds one byte slice per
/// `.param` of the kernel, each at least the parameter's size (only its first `size`
/// bytes are read, as the driver reads `kernelParams`). Blocks run on up to `threads`
/// host threads; results do not depend on that number.
pub fn launch(
    module: &Module,
    kernel: &str,
    cfg: &LaunchConfig,
    args: &[&[u8]],
    mem: &dyn GlobalMemory,
    checks: Checks,
    threads: usize,
) -> Result<LaunchStats, LaunchError> {
    run(module, kernel, cfg, args, mem, checks, threads, None).map(|(s, _)| s)
}

/// [`launch`], counting what it executes (see [`crate::profile`]). The counters do not
/// depend on `threads`. With [`ProfileOptions::sample_blocks`] only a subset of the
/// blocks runs: the others write nothing.
#[allow(clippy::too_many_arguments)]
pub fn launch_profiled(
    module: &Module,
    kernel: &str,
    cfg: &LaunchConfig,
    args: &[&[u8]],
    mem: &dyn GlobalMemory,
    checks: Checks,
    threads: usize,
    profile: &ProfileOptions,
) -> Result<(LaunchStats, LaunchCounters), LaunchError> {
    let (stats, counters) = run(
        module,
        kernel,
        cfg,
        args,
        mem,
        checks,
        threads,
        Some(*profile),
    )?;
    Ok((stats, counters.expect("a profiled launch has counters")))
}

#[allow(clippy::too_many_arguments)]
fn run(
    module: &Module,
    kernel: &str,
    cfg: &LaunchConfig,
    args: &[&[u8]],
    mem: &dyn GlobalMemory,
    checks: Checks,
    threads: usize,
    profile: Option<ProfileOptions>,
) -> Result<(LaunchStats, Option<LaunchCounters>), LaunchError> {
    let Prepared {
        entry,
        packed,
        shared_bytes,
    } = prepare(module, kernel, cfg, args)?;
    let [gx, gy, gz] = cfg.grid;
    let l = engine::Launch {
        module,
        entry,
        grid: cfg.grid,
        block: cfg.block,
        args: &packed,
        mem,
        checks,
        shared_bytes,
        profile,
        programmatic: cfg.programmatic,
        atomic_lock: Mutex::new(()),
    };
    let n_blocks = gx as u64 * gy as u64 * gz as u64;
    // Blocks to interpret: all, or an evenly spaced subset when sampling.
    let n_run = profile
        .and_then(|p| p.sample_blocks)
        .map_or(n_blocks, |n| n.clamp(1, n_blocks));
    let block_of = |i: u64| {
        if n_run == n_blocks {
            i
        } else {
            (i as u128 * n_blocks as u128 / n_run as u128) as u64
        }
    };
    let collectors: Mutex<Vec<Collector>> = Mutex::new(Vec::new());
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let first_fault: Mutex<Option<(u64, Box<KernelFault>)>> = Mutex::new(None);
    let warp_i = AtomicU64::new(0);
    let thread_i = AtomicU64::new(0);
    let workers = threads.clamp(1, 64).min(n_run.min(64) as usize);
    let work = || {
        let mut runner = engine::BlockRunner::new(&l);
        while !stop.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n_run {
                break;
            }
            let b = block_of(i);
            let ctaid = [
                (b % gx as u64) as u32,
                ((b / gx as u64) % gy as u64) as u32,
                (b / (gx as u64 * gy as u64)) as u32,
            ];
            if let Err(fault) = runner.run(ctaid) {
                stop.store(true, Ordering::Relaxed);
                let mut first = first_fault.lock().unwrap_or_else(|e| e.into_inner());
                if first.as_ref().is_none_or(|(fb, _)| b < *fb) {
                    *first = Some((b, fault));
                }
            }
        }
        warp_i.fetch_add(runner.warp_instructions, Ordering::Relaxed);
        thread_i.fetch_add(runner.thread_instructions, Ordering::Relaxed);
        if let Some(p) = runner.prof.take() {
            collectors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(*p);
        }
    };
    if workers <= 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(work);
            }
        });
    }
    if let Some((_, fault)) = first_fault.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(LaunchError::Fault(fault));
    }
    let stats = LaunchStats {
        warp_instructions: warp_i.into_inner(),
        thread_instructions: thread_i.into_inner(),
    };
    let counters = profile.map(|p| {
        let mut all = collectors
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_iter();
        let mut c = all.next().unwrap_or_else(|| Collector::new(&p));
        for o in all {
            c.merge(o);
        }
        let mut c = c.finish(n_blocks);
        c.grid = cfg.grid;
        c.block = cfg.block;
        c.dynamic_shared = cfg.dynamic_shared;
        c.static_shared = module.extern_shared.unwrap_or(module.shared_bytes) as u32;
        c
    });
    Ok((stats, counters))
}
