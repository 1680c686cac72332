//! The checks the interpreter runs on every kernel, and the report of a failed one.

use std::fmt;

use crate::error::{CuError, ErrorCode};
use crate::tensor::MmaModel;

/// Which checks run during a launch. All are on by default (`Checks::default()`), as in
/// tests; out-of-bounds accesses always fault whatever the setting, as on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checks {
    /// Misaligned loads/stores and use of freed memory (bounds are always checked).
    pub memcheck: bool,
    /// Shared-memory accesses of two warps to the same bytes, at least one a write,
    /// with no `bar.sync` between them.
    pub racecheck: bool,
    /// `shfl.sync` / `bar.warp.sync` whose member mask names lanes that are not
    /// executing it together, and `bar.sync` reached by only part of a block or warp.
    pub synccheck: bool,
    /// Loads of global bytes that were never written since allocation.
    pub initcheck: bool,
    /// `.approx` instructions return a result at the edge of the PTX ISA's documented
    /// error bound (deterministically, in a direction that depends on the input) instead
    /// of the correctly rounded one, so a kernel that needs more precision than the ISA
    /// promises fails its tests here rather than on some GPU. Off, they are correctly
    /// rounded. It covers f16/bf16 `mma` too: their results go to the edge of
    /// [`crate::tensor::error_bound`].
    pub approx_at_bound: bool,
    /// How f16/bf16 `mma` adds its products when `approx_at_bound` is off (the ISA
    /// leaves it open; not a check, but like `approx_at_bound` a choice among the
    /// results the ISA allows). Default [`MmaModel::SM90`].
    pub mma: MmaModel,
}

impl Checks {
    /// Every check on.
    pub const ALL: Checks = Checks {
        memcheck: true,
        racecheck: true,
        synccheck: true,
        initcheck: true,
        approx_at_bound: true,
        mma: MmaModel::SM90,
    };
    /// Only what a GPU itself would fault on (bounds).
    pub const NONE: Checks = Checks {
        memcheck: false,
        racecheck: false,
        synccheck: false,
        initcheck: false,
        approx_at_bound: false,
        mma: MmaModel::SM90,
    };
}

impl Default for Checks {
    fn default() -> Checks {
        Checks::ALL
    }
}

/// What went wrong in a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// A global access outside every live allocation.
    OutOfBounds,
    /// A global access to freed memory.
    UseAfterFree,
    /// A load or store whose address is not a multiple of its size.
    Misaligned,
    /// A global load of bytes never written.
    UninitializedRead,
    /// A shared or local access outside the block's shared memory / the thread's local
    /// memory.
    LocalOrSharedOutOfBounds,
    /// Two warps of a block accessed the same shared bytes, one writing, without a
    /// `bar.sync` between them.
    SharedRace,
    /// A `shfl.sync` / `bar.warp.sync` member mask names lanes not executing it
    /// together (or a shuffle read an inactive lane).
    SyncMask,
    /// `bar.sync` reached by part of a block, under divergence, or some threads exited
    /// while others wait at it.
    BarrierDivergence,
    /// `trap`, an instruction the emulator cannot execute with these operands, or a
    /// call/return mismatch.
    IllegalInstruction,
    /// In a launch with programmatic stream serialisation, a global access before
    /// `griddepcontrol.wait`: the grid before it may still be writing or reading it.
    DependencyRace,
}

impl FaultKind {
    /// The error a GPU (or, for the sanitizer-only checks, compute-sanitizer) returns.
    pub fn error_code(self) -> ErrorCode {
        match self {
            FaultKind::OutOfBounds
            | FaultKind::UseAfterFree
            | FaultKind::LocalOrSharedOutOfBounds => ErrorCode::IllegalAddress,
            FaultKind::Misaligned => ErrorCode::MisalignedAddress,
            FaultKind::IllegalInstruction => ErrorCode::IllegalInstruction,
            FaultKind::UninitializedRead
            | FaultKind::SharedRace
            | FaultKind::DependencyRace
            | FaultKind::SyncMask
            | FaultKind::BarrierDivergence => ErrorCode::LaunchFailed,
        }
    }

    /// The check that reports it, as named in reports (`memcheck`, `racecheck`,
    /// `synccheck`, `initcheck`).
    pub fn check_name(self) -> &'static str {
        match self {
            FaultKind::OutOfBounds
            | FaultKind::UseAfterFree
            | FaultKind::Misaligned
            | FaultKind::LocalOrSharedOutOfBounds
            | FaultKind::IllegalInstruction => "memcheck",
            FaultKind::UninitializedRead => "initcheck",
            FaultKind::SharedRace | FaultKind::DependencyRace => "racecheck",
            FaultKind::SyncMask | FaultKind::BarrierDivergence => "synccheck",
        }
    }
}

/// A failed check or a fault in a kernel: where (kernel, PTX file and line, the
/// instruction text, block and thread) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFault {
    /// What went wrong.
    pub kind: FaultKind,
    /// The `.entry` that was launched.
    pub kernel: String,
    /// The module's file name as given to the parser.
    pub file: String,
    /// 1-based line of the faulting instruction in the PTX text.
    pub line: u32,
    /// The instruction's source text.
    pub instruction: String,
    /// `%ctaid` of the faulting thread.
    pub block: [u32; 3],
    /// `%tid` of the faulting thread.
    pub thread: [u32; 3],
    /// The address involved, if any.
    pub address: Option<u64>,
    /// Anything else worth saying (the other warp of a race, the mask of a sync error).
    pub detail: String,
}

impl KernelFault {
    /// The driver error this fault turns into.
    pub fn to_cu_error(&self) -> CuError {
        CuError::new(self.kind.error_code(), self.to_string())
    }
}

impl fmt::Display for KernelFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} in kernel {} at {}:{} `{}`, block ({},{},{}) thread ({},{},{})",
            self.kind.check_name(),
            self.kind,
            self.kernel,
            self.file,
            self.line,
            self.instruction,
            self.block[0],
            self.block[1],
            self.block[2],
            self.thread[0],
            self.thread[1],
            self.thread[2],
        )?;
        if let Some(a) = self.address {
            write!(f, ", address {a:#x}")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}
