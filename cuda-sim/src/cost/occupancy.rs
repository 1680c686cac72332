//! Occupancy and waves: how many blocks of a kernel an SM holds at once, what limits
//! it, and how many rounds the grid takes.

use super::spec::Arch;
use super::CostError;

/// A kernel's static resources, as `ptxas -v` reports them for one architecture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub static_shared: u32,
    /// Bytes of register spill stores per thread.
    pub spill_store_bytes: u32,
    /// Bytes of register spill loads per thread.
    pub spill_load_bytes: u32,
    /// Stack frame per thread, bytes.
    pub stack_bytes: u32,
}

/// What limits the blocks per SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Registers.
    Registers,
    /// Shared memory.
    SharedMemory,
    /// Resident threads (warps).
    Threads,
    /// Resident blocks.
    Blocks,
}

/// Occupancy of one launch on one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Occupancy {
    /// Blocks an SM holds at once.
    pub blocks_per_sm: u32,
    /// The binding limit (the first, in the order registers, shared memory, threads,
    /// blocks, among equal ones).
    pub limited_by: Limit,
    /// Resident warps per SM over the most an SM holds.
    pub fraction: f64,
    /// Rounds of resident blocks the grid takes: ceil(blocks / (blocks_per_sm × SMs)).
    pub waves: u64,
}

/// The occupancy of `blocks` blocks of `threads` threads each, with `dynamic_shared`
/// bytes of dynamic shared memory, of a kernel with resources `res`, on `arch`.
pub fn occupancy(
    arch: &Arch,
    res: &KernelResources,
    threads: u32,
    dynamic_shared: u32,
    blocks: u64,
) -> Result<Occupancy, CostError> {
    if threads == 0 || blocks == 0 {
        return Err(CostError::new(format!(
            "occupancy of {blocks} blocks of {threads} threads"
        )));
    }
    let warps = threads.div_ceil(32);
    let max_warps = arch.max_threads_per_sm / 32;
    let by_regs = if res.registers == 0 {
        u32::MAX
    } else {
        let per_warp = (res.registers * 32).div_ceil(arch.reg_alloc_unit) * arch.reg_alloc_unit;
        (arch.regs_per_sm / per_warp) / warps
    };
    let shared =
        res.static_shared as u64 + dynamic_shared as u64 + arch.shared_reserved_per_block as u64;
    let by_shared = (arch.shared_per_sm as u64 / shared).min(u32::MAX as u64) as u32;
    let by_threads = max_warps / warps;
    let limits = [
        (by_regs, Limit::Registers),
        (by_shared, Limit::SharedMemory),
        (by_threads, Limit::Threads),
        (arch.max_blocks_per_sm, Limit::Blocks),
    ];
    let (blocks_per_sm, limited_by) = limits
        .iter()
        .copied()
        .min_by_key(|(n, _)| *n)
        .expect("four limits");
    if blocks_per_sm == 0 {
        return Err(CostError::new(format!(
            "a block of {threads} threads, {} registers each, {shared} bytes of shared memory \
             does not fit an SM ({limited_by:?})",
            res.registers
        )));
    }
    let per_wave = blocks_per_sm as u64 * arch.sms as u64;
    Ok(Occupancy {
        blocks_per_sm,
        limited_by,
        fraction: (blocks_per_sm * warps) as f64 / max_warps as f64,
        waves: blocks.div_ceil(per_wave),
    })
}

#[cfg(test)]
#[allow(clippy::too_many_arguments)]
mod tests {
    use super::*;
    use crate::cost::GpuSpec;
    use rstest::rstest;

    fn res(registers: u32, static_shared: u32) -> KernelResources {
        KernelResources {
            registers,
            static_shared,
            ..Default::default()
        }
    }

    // Each row worked by hand for an H100 (132 SMs, 64K registers, 228 KB shared with
    // 1 KB reserved per block, 64 warps, 32 blocks per SM).
    #[rstest]
    // 32 regs × 32 lanes = 1024 per warp: 64 warps fit, 8 warps a block: 8 blocks by
    // registers and by threads; registers come first.
    #[case::regs_equal_threads(32, 0, 0, 256, 1056, 8, Limit::Registers, 1.0, 1)]
    // 40 regs: 1280 per warp, 51 warps, 6 blocks of 8 warps (48 warps, 0.75).
    #[case::regs_40(40, 0, 0, 256, 1000, 6, Limit::Registers, 0.75, 2)]
    // 255 regs: 8160 rounded to 8192 per warp: 8 warps, 2 blocks of 4 warps.
    #[case::regs_255(255, 0, 0, 128, 264, 2, Limit::Registers, 0.125, 1)]
    // 48 KB static + 1 KB: 228 / 49 = 4 blocks.
    #[case::shared(16, 48 << 10, 0, 128, 529, 4, Limit::SharedMemory, 0.25, 2)]
    // dynamic shared counts too: 100 KB + 1 KB: 2 blocks.
    #[case::dynamic_shared(16, 0, 100 << 10, 64, 264, 2, Limit::SharedMemory, 4.0 / 64.0, 1)]
    // 32-thread blocks with few registers: 32 blocks per SM.
    #[case::blocks(16, 0, 0, 32, 4225, 32, Limit::Blocks, 0.5, 2)]
    // 1024-thread blocks: 2 by threads (16 regs: 512/warp, 128 warps by registers).
    #[case::threads(16, 0, 0, 1024, 265, 2, Limit::Threads, 1.0, 2)]
    fn hand_computed_occupancy(
        #[case] registers: u32,
        #[case] static_shared: u32,
        #[case] dynamic: u32,
        #[case] threads: u32,
        #[case] blocks: u64,
        #[case] per_sm: u32,
        #[case] limit: Limit,
        #[case] fraction: f64,
        #[case] waves: u64,
    ) {
        let arch = GpuSpec::h100_sxm().arch;
        let o = occupancy(
            &arch,
            &res(registers, static_shared),
            threads,
            dynamic,
            blocks,
        )
        .expect("fits");
        assert_eq!(o.blocks_per_sm, per_sm);
        assert_eq!(o.limited_by, limit);
        assert_eq!(o.fraction, fraction);
        assert_eq!(o.waves, waves);
    }

    #[test]
    fn a_block_that_does_not_fit_is_an_error() {
        let arch = GpuSpec::h100_sxm().arch;
        assert!(occupancy(&arch, &res(16, 228 << 10), 32, 0, 1).is_err());
        // 255 registers × 1024 threads needs 256K registers.
        assert!(occupancy(&arch, &res(255, 0), 1024, 0, 1).is_err());
        assert!(occupancy(&arch, &res(16, 0), 0, 0, 1).is_err());
    }
}
