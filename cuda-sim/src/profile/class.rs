//! Instruction classes: what a warp instruction costs depends on the pipe that runs it,
//! so every decoded operation maps to exactly one class (the match below has no
//! catch-all arm: a new `ir::Op` variant does not compile until it is classified).

use crate::ptx::ir::{BinOp, HalfOp, Op, Space, Ty, UnOp};

/// The state space of a load, store or atomic, as the counters group them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemSpace {
    /// `.global` (and generic addresses, which cuda-sim maps to global).
    Global,
    /// `.shared`.
    Shared,
    /// `.local`.
    Local,
    /// `.param` (a kernel's or a function's parameters).
    Param,
}

impl MemSpace {
    /// Every space, in index order.
    pub const ALL: [MemSpace; 4] = [
        MemSpace::Global,
        MemSpace::Shared,
        MemSpace::Local,
        MemSpace::Param,
    ];

    fn of(space: Space) -> MemSpace {
        match space {
            Space::Global => MemSpace::Global,
            Space::Shared => MemSpace::Shared,
            Space::Local => MemSpace::Local,
            Space::KernelParam | Space::FuncParam => MemSpace::Param,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Bytes one lane moves in one access (`ld.v4.f32` = 16), as the counters group them.
pub const ACCESS_WIDTHS: [u8; 6] = [1, 2, 4, 8, 16, 32];

fn width_index(width: u8) -> usize {
    match width {
        1 => 0,
        2 => 1,
        4 => 2,
        8 => 3,
        16 => 4,
        _ => 5,
    }
}

/// The class of a warp instruction: which pipe runs it, and so which issue rate bounds
/// it in the cost model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InstrClass {
    /// `fma.rn.f32`, `mad.rn.f32`.
    F32Fma,
    /// `mul.f32`.
    F32Mul,
    /// `add.f32`, `sub.f32`.
    F32Add,
    /// f32 compare, min, max, abs, neg and bit operations typed `.f32`.
    F32Other,
    /// f16, f16x2, bf16 and bf16x2 arithmetic (`add`, `sub`, `mul`, `fma`, `min`,
    /// `max`, `neg`, `abs`).
    F16Arith,
    /// f64 arithmetic, compares and fma.
    F64Arith,
    /// Integer add, sub, logic, shifts, compares, min/max, `bfe`, `bfi`, `prmt`,
    /// `lop3`, `shf`, `popc`, `clz`, `brev`, `bfind`, `selp`, predicate logic,
    /// integer-to-integer `cvt`.
    IntAlu,
    /// Integer `mul.lo/hi/wide` and `mad.lo/hi/wide`.
    IntMul,
    /// `dp4a`.
    Dp4a,
    /// Tensor-core matrix instructions (`mma.sync`); their multiply-adds are counted in
    /// `LaunchCounters::tensor_macs`.
    TensorCore,
    /// The special-function unit: `ex2`, `lg2`, `rsqrt`, `rcp.approx`, `sqrt.approx`,
    /// `tanh`, `sin`, `cos`.
    Special,
    /// Operations the assembler expands into a sequence around a special-function
    /// result: integer and float `div`, `rem`, `sqrt.rn`, `rcp.rn`.
    Emulated,
    /// `cvt` from or to a float type.
    Convert,
    /// `mov` and `cvta`.
    Move,
    /// `shfl.sync` (and votes, when decoded).
    ShuffleVote,
    /// `bra`, `call`, `ret`, `exit`, `trap`, `bar.sync`, `bar.warp.sync`, `fence`,
    /// `membar`, `cp.async.commit_group`, `cp.async.wait_group`.
    Control,
    /// A load from `space` of `width` bytes per lane (`ldmatrix` is a shared load of 4
    /// bytes per matrix, `cp.async` a global load of its copy size).
    Load {
        /// The state space.
        space: MemSpace,
        /// Bytes per lane (one of [`ACCESS_WIDTHS`]).
        width: u8,
    },
    /// A store to `space` of `width` bytes per lane.
    Store {
        /// The state space.
        space: MemSpace,
        /// Bytes per lane (one of [`ACCESS_WIDTHS`]).
        width: u8,
    },
    /// An atomic or reduction (`atom`, `red`) on `space` (global or shared).
    Atomic {
        /// The state space.
        space: MemSpace,
    },
}

/// The classes without a space or width, in index order.
const SIMPLE: [InstrClass; 16] = [
    InstrClass::F32Fma,
    InstrClass::F32Mul,
    InstrClass::F32Add,
    InstrClass::F32Other,
    InstrClass::F16Arith,
    InstrClass::F64Arith,
    InstrClass::IntAlu,
    InstrClass::IntMul,
    InstrClass::Dp4a,
    InstrClass::TensorCore,
    InstrClass::Special,
    InstrClass::Emulated,
    InstrClass::Convert,
    InstrClass::Move,
    InstrClass::ShuffleVote,
    InstrClass::Control,
];

const MEM: usize = MemSpace::ALL.len() * ACCESS_WIDTHS.len();

impl InstrClass {
    /// How many classes there are.
    pub const COUNT: usize = SIMPLE.len() + 2 * MEM + 2;

    /// Every class, in index order.
    pub fn all() -> impl Iterator<Item = InstrClass> {
        (0..Self::COUNT).map(Self::from_index)
    }

    /// The class's position in [`ClassCounts`].
    pub fn index(self) -> usize {
        let n = SIMPLE.len();
        let mem =
            |space: MemSpace, width: u8| space.index() * ACCESS_WIDTHS.len() + width_index(width);
        match self {
            InstrClass::Load { space, width } => n + mem(space, width),
            InstrClass::Store { space, width } => n + MEM + mem(space, width),
            InstrClass::Atomic { space } => n + 2 * MEM + usize::from(space != MemSpace::Global),
            simple => SIMPLE
                .iter()
                .position(|&c| c == simple)
                .expect("every simple class is in SIMPLE"),
        }
    }

    /// The class at `index` (`index < COUNT`).
    pub fn from_index(index: usize) -> InstrClass {
        let n = SIMPLE.len();
        let mem = |i: usize| {
            (
                MemSpace::ALL[i / ACCESS_WIDTHS.len()],
                ACCESS_WIDTHS[i % ACCESS_WIDTHS.len()],
            )
        };
        if index < n {
            SIMPLE[index]
        } else if index < n + MEM {
            let (space, width) = mem(index - n);
            InstrClass::Load { space, width }
        } else if index < n + 2 * MEM {
            let (space, width) = mem(index - n - MEM);
            InstrClass::Store { space, width }
        } else {
            assert!(index < Self::COUNT, "class index {index} out of range");
            InstrClass::Atomic {
                space: if index == n + 2 * MEM {
                    MemSpace::Global
                } else {
                    MemSpace::Shared
                },
            }
        }
    }

    /// A short name: `f32_fma`, `ld_global_16`, `atom_shared`, ...
    pub fn name(self) -> String {
        let space = |s: MemSpace| match s {
            MemSpace::Global => "global",
            MemSpace::Shared => "shared",
            MemSpace::Local => "local",
            MemSpace::Param => "param",
        };
        match self {
            InstrClass::Load { space: s, width } => format!("ld_{}_{width}", space(s)),
            InstrClass::Store { space: s, width } => format!("st_{}_{width}", space(s)),
            InstrClass::Atomic { space: s } => format!("atom_{}", space(s)),
            other => match other {
                InstrClass::F32Fma => "f32_fma",
                InstrClass::F32Mul => "f32_mul",
                InstrClass::F32Add => "f32_add",
                InstrClass::F32Other => "f32_other",
                InstrClass::F16Arith => "f16_arith",
                InstrClass::F64Arith => "f64_arith",
                InstrClass::IntAlu => "int_alu",
                InstrClass::IntMul => "int_mul",
                InstrClass::Dp4a => "dp4a",
                InstrClass::TensorCore => "tensor_core",
                InstrClass::Special => "special",
                InstrClass::Emulated => "emulated",
                InstrClass::Convert => "convert",
                InstrClass::Move => "move",
                InstrClass::ShuffleVote => "shuffle_vote",
                _ => "control",
            }
            .to_string(),
        }
    }

    /// The class of a decoded operation.
    pub fn of(op: &Op) -> InstrClass {
        match op {
            Op::Mov { .. } => InstrClass::Move,
            Op::Ld { space, ty, d, .. } => InstrClass::Load {
                space: MemSpace::of(*space),
                width: (ty.bytes() * d.len()) as u8,
            },
            Op::St { space, ty, a, .. } => InstrClass::Store {
                space: MemSpace::of(*space),
                width: (ty.bytes() * a.len()) as u8,
            },
            Op::Bin { op, ty, .. } => bin_class(*op, *ty),
            Op::Mad { ty, .. } => match float_kind(*ty) {
                Some(FloatKind::F32) => InstrClass::F32Fma,
                Some(FloatKind::F64) => InstrClass::F64Arith,
                Some(FloatKind::F16) => InstrClass::F16Arith,
                None => InstrClass::IntMul,
            },
            Op::Un { op, ty, .. } => match op {
                UnOp::Neg | UnOp::Abs => match float_kind(*ty) {
                    Some(FloatKind::F32) => InstrClass::F32Other,
                    Some(FloatKind::F64) => InstrClass::F64Arith,
                    Some(FloatKind::F16) => InstrClass::F16Arith,
                    None => InstrClass::IntAlu,
                },
                UnOp::Not => InstrClass::IntAlu,
                UnOp::Sqrt | UnOp::Rcp => InstrClass::Emulated,
                UnOp::SqrtApprox
                | UnOp::Ex2
                | UnOp::Lg2
                | UnOp::Tanh
                | UnOp::RcpApprox
                | UnOp::Rsqrt
                | UnOp::Sin
                | UnOp::Cos => InstrClass::Special,
            },
            Op::Setp { ty, .. } => match float_kind(*ty) {
                Some(FloatKind::F32) => InstrClass::F32Other,
                Some(FloatKind::F64) => InstrClass::F64Arith,
                Some(FloatKind::F16) => InstrClass::F16Arith,
                None => InstrClass::IntAlu,
            },
            Op::Pred { .. } | Op::Selp { .. } | Op::Bfe { .. } => InstrClass::IntAlu,
            Op::Cvt { dty, sty, .. } => {
                if dty.is_float() || sty.is_float() {
                    InstrClass::Convert
                } else {
                    InstrClass::IntAlu
                }
            }
            Op::Dp4a { .. } => InstrClass::Dp4a,
            Op::Shfl { .. } => InstrClass::ShuffleVote,
            Op::Half { op, .. } => match op {
                HalfOp::Ex2 => InstrClass::Special,
                _ => InstrClass::F16Arith,
            },
            Op::CvtPack { .. } => InstrClass::Convert,
            Op::Prmt { .. }
            | Op::Lop3 { .. }
            | Op::Shf { .. }
            | Op::Bfi { .. }
            | Op::Bits { .. } => InstrClass::IntAlu,
            Op::Atom { space, .. } => InstrClass::Atomic {
                space: MemSpace::of(*space),
            },
            Op::Mma(_) => InstrClass::TensorCore,
            // A shared load of 4 bytes per lane per matrix.
            Op::Ldmatrix { d, .. } => InstrClass::Load {
                space: MemSpace::Shared,
                width: (4 * d.len()) as u8,
            },
            // Issued as a global load (its shared store is counted as traffic).
            Op::CpAsync { size, .. } => InstrClass::Load {
                space: MemSpace::Global,
                width: *size,
            },
            // A hint: issued, no bytes of its own (the load it serves counts them).
            Op::Prefetch { .. }
            | Op::Fence
            | Op::GridDepWait
            | Op::GridDepLaunch
            | Op::CpAsyncCommit
            | Op::CpAsyncWait { .. }
            | Op::BarWarpSync { .. }
            | Op::BarSync
            | Op::Bra { .. }
            | Op::Call { .. }
            | Op::Ret
            | Op::Exit
            | Op::Trap => InstrClass::Control,
        }
    }
}

enum FloatKind {
    F16,
    F32,
    F64,
}

fn float_kind(ty: Ty) -> Option<FloatKind> {
    match ty {
        Ty::F(16) | Ty::Bf16 => Some(FloatKind::F16),
        Ty::F(32) => Some(FloatKind::F32),
        Ty::F(_) => Some(FloatKind::F64),
        Ty::B(_) | Ty::U(_) | Ty::S(_) | Ty::Pred => None,
    }
}

fn bin_class(op: BinOp, ty: Ty) -> InstrClass {
    match (float_kind(ty), op) {
        (_, BinOp::Div | BinOp::Rem) => InstrClass::Emulated,
        (Some(FloatKind::F32), BinOp::Add | BinOp::Sub) => InstrClass::F32Add,
        (Some(FloatKind::F32), BinOp::MulLo | BinOp::MulHi | BinOp::MulWide) => InstrClass::F32Mul,
        (Some(FloatKind::F32), _) => InstrClass::F32Other,
        (Some(FloatKind::F64), _) => InstrClass::F64Arith,
        (Some(FloatKind::F16), _) => InstrClass::F16Arith,
        (None, BinOp::MulLo | BinOp::MulHi | BinOp::MulWide) => InstrClass::IntMul,
        (
            None,
            BinOp::Add
            | BinOp::Sub
            | BinOp::And
            | BinOp::Or
            | BinOp::Xor
            | BinOp::Shl
            | BinOp::Shr
            | BinOp::Min
            | BinOp::Max,
        ) => InstrClass::IntAlu,
    }
}

/// Warp instructions per class, indexed by [`InstrClass::index`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassCounts(pub(crate) Vec<u64>);

impl Default for ClassCounts {
    fn default() -> Self {
        ClassCounts(vec![0; InstrClass::COUNT])
    }
}

impl ClassCounts {
    /// The count of `class`.
    pub fn get(&self, class: InstrClass) -> u64 {
        self.0[class.index()]
    }

    /// Every class with a non-zero count, in index order.
    pub fn nonzero(&self) -> impl Iterator<Item = (InstrClass, u64)> + '_ {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, &n)| n != 0)
            .map(|(i, &n)| (InstrClass::from_index(i), n))
    }

    /// The sum over all classes.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub(crate) fn add(&mut self, class: InstrClass) {
        self.0[class.index()] += 1;
    }

    pub(crate) fn merge(&mut self, other: &ClassCounts) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a += b;
        }
    }

    pub(crate) fn scale(&mut self, f: impl Fn(u64) -> u64) {
        for a in &mut self.0 {
            *a = f(*a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_round_trips_for_every_class() {
        let all: Vec<InstrClass> = InstrClass::all().collect();
        assert_eq!(all.len(), InstrClass::COUNT);
        for (i, c) in all.iter().enumerate() {
            assert_eq!(c.index(), i, "{c:?}");
        }
        let names: std::collections::HashSet<String> = all.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), InstrClass::COUNT, "names are distinct");
    }

    #[test]
    fn widths_and_spaces_index_distinctly() {
        let c = InstrClass::Load {
            space: MemSpace::Shared,
            width: 16,
        };
        assert_eq!(InstrClass::from_index(c.index()), c);
        assert_eq!(c.name(), "ld_shared_16");
        let a = InstrClass::Atomic {
            space: MemSpace::Shared,
        };
        assert_eq!(InstrClass::from_index(a.index()), a);
    }
}
