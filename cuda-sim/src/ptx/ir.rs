//! The decoded form of a PTX module: what the interpreter executes. Registers, labels,
//! symbols and parameters are resolved to indices and offsets at parse time.

/// A scalar PTX type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// `.b8` .. `.b64`, untyped bits.
    B(u8),
    /// `.u8` .. `.u64`.
    U(u8),
    /// `.s8` .. `.s64`.
    S(u8),
    /// `.f16`, `.f32`, `.f64`.
    F(u8),
    /// `.bf16`.
    Bf16,
    /// `.pred`.
    Pred,
}

impl Ty {
    /// Size in bytes (a predicate counts as 1).
    pub fn bytes(self) -> usize {
        match self {
            Ty::B(b) | Ty::U(b) | Ty::S(b) | Ty::F(b) => b as usize / 8,
            Ty::Bf16 => 2,
            Ty::Pred => 1,
        }
    }

    /// Size in bits.
    pub fn bits(self) -> u32 {
        self.bytes() as u32 * 8
    }

    pub(crate) fn is_signed(self) -> bool {
        matches!(self, Ty::S(_))
    }

    pub(crate) fn is_float(self) -> bool {
        matches!(self, Ty::F(_) | Ty::Bf16)
    }
}

/// A special register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// `%tid.{x,y,z}`.
    Tid(u8),
    /// `%ntid.{x,y,z}`.
    Ntid(u8),
    /// `%ctaid.{x,y,z}`.
    Ctaid(u8),
    /// `%nctaid.{x,y,z}`.
    Nctaid(u8),
    /// `%laneid`.
    Laneid,
    /// `%warpid`.
    Warpid,
}

/// State spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// `.global` (and generic addresses, which cuda-sim maps to global).
    Global,
    /// `.shared`: offsets in the block's shared memory.
    Shared,
    /// `.local`: offsets in the thread's local memory.
    Local,
    /// `.param` of an `.entry`: offsets in the launch's argument bytes.
    KernelParam,
    /// `.param` of a `.func` or a call scope: offsets in the frame's per-lane param bytes.
    FuncParam,
}

/// An operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// A register (index in the function's register file).
    Reg(u16),
    /// An immediate, as bits (floats as their IEEE bits, integers sign-extended to 64).
    Imm(u64),
    /// A special register.
    Special(Special),
    /// The address of a symbol in its space (`mov.u64 %rd, fa_smem;`).
    SymAddr(Space, u64),
    /// `{a, b, ...}`: a vector of registers (or `_` as `None`).
    Vector(Vec<Option<u16>>),
}

/// An address operand `[base+offset]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AddrBase {
    /// A register holding an address (or offset, for shared/local/param spaces).
    Reg(u16),
    /// A symbol: its offset in the instruction's space.
    Sym(u64),
}

/// `[base+offset]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Addr {
    /// Register or symbol.
    pub base: AddrBase,
    /// Byte offset added.
    pub offset: i64,
}

/// Rounding of float results and float-to-integer conversions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rnd {
    /// Round to nearest even (`.rn`, `.rni`).
    Nearest,
    /// Toward zero (`.rz`, `.rzi`).
    Zero,
    /// Toward minus infinity (`.rm`, `.rmi`).
    Down,
    /// Toward plus infinity (`.rp`, `.rpi`).
    Up,
}

/// Two-operand operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    /// `add`.
    Add,
    /// `sub`.
    Sub,
    /// `mul.lo` (integers) / `mul` (floats).
    MulLo,
    /// `mul.hi`.
    MulHi,
    /// `mul.wide`: the double-width product.
    MulWide,
    /// `div`.
    Div,
    /// `rem`.
    Rem,
    /// `and`.
    And,
    /// `or`.
    Or,
    /// `xor`.
    Xor,
    /// `shl`.
    Shl,
    /// `shr`.
    Shr,
    /// `min`.
    Min,
    /// `max`.
    Max,
}

/// One-operand operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    /// `neg`.
    Neg,
    /// `abs`.
    Abs,
    /// `not`.
    Not,
    /// `sqrt.rn` (correctly rounded).
    Sqrt,
    /// `sqrt.approx`.
    SqrtApprox,
    /// `ex2.approx`.
    Ex2,
    /// `lg2.approx`.
    Lg2,
    /// `tanh.approx`.
    Tanh,
    /// `rcp.approx`.
    RcpApprox,
    /// `rcp.rn` (correctly rounded).
    Rcp,
    /// `rsqrt.approx`.
    Rsqrt,
    /// `sin.approx`.
    Sin,
    /// `cos.approx`.
    Cos,
}

/// `setp` comparisons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// `eq` (ordered for floats).
    Eq,
    /// `ne` (ordered for floats).
    Ne,
    /// `lt`.
    Lt,
    /// `le`.
    Le,
    /// `gt`.
    Gt,
    /// `ge`.
    Ge,
    /// `equ` etc.: unordered versions (true if either is NaN).
    Equ,
    /// `neu`.
    Neu,
    /// `ltu`.
    Ltu,
    /// `leu`.
    Leu,
    /// `gtu`.
    Gtu,
    /// `geu`.
    Geu,
    /// `num`: neither is NaN.
    Num,
    /// `nan`: either is NaN.
    Nan,
}

/// Shuffle modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShflMode {
    /// `.up`.
    Up,
    /// `.down`.
    Down,
    /// `.bfly`.
    Bfly,
    /// `.idx`.
    Idx,
}

/// Predicate logic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredOp {
    /// `and.pred`.
    And,
    /// `or.pred`.
    Or,
    /// `xor.pred`.
    Xor,
    /// `not.pred`.
    Not,
}

/// Half-precision arithmetic on one value (`.f16`, `.bf16`) or on the two halves of a
/// 32-bit register (`.f16x2`, `.bf16x2`, low half first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfOp {
    /// `add.rn`.
    Add,
    /// `sub.rn`.
    Sub,
    /// `mul.rn`.
    Mul,
    /// `fma.rn`.
    Fma,
    /// `min` (IEEE minNum, -0 below +0).
    Min,
    /// `max`.
    Max,
    /// `neg` (a sign flip).
    Neg,
    /// `abs` (the sign cleared).
    Abs,
    /// `ex2.approx`.
    Ex2,
}

/// `prmt` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrmtMode {
    /// The generic form: four selector nibbles in `c`.
    Generic,
    /// `.f4e`: forward 4 extract.
    F4e,
    /// `.b4e`: backward 4 extract.
    B4e,
    /// `.rc8`: replicate 8.
    Rc8,
    /// `.ecl`: edge clamp left.
    Ecl,
    /// `.ecr`: edge clamp right.
    Ecr,
    /// `.rc16`: replicate 16.
    Rc16,
}

/// One-operand bit operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitOp {
    /// `popc`: set bits (a `.u32` result).
    Popc,
    /// `clz`: leading zeros (a `.u32` result).
    Clz,
    /// `brev`: bits reversed.
    Brev,
    /// `bfind`: position of the most significant non-sign bit, `0xffffffff` if none.
    Bfind,
}

/// Atomic read-modify-write operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomOp {
    /// `.add` (integers wrap; `.f32` rounds to nearest even).
    Add,
    /// `.inc`: `old >= b ? 0 : old + 1` (unsigned).
    Inc,
    /// `.dec`: `old == 0 || old > b ? b : old - 1` (unsigned).
    Dec,
    /// `.min`.
    Min,
    /// `.max`.
    Max,
    /// `.and`.
    And,
    /// `.or`.
    Or,
    /// `.xor`.
    Xor,
    /// `.exch`.
    Exch,
    /// `.cas`: `old == b ? c : old`.
    Cas,
}

/// The element types of an `mma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaKind {
    /// `.f16` inputs; accumulators `.f32` or `.f16`.
    F16 {
        /// `.dtype` is `.f32` (else `.f16`).
        d_f32: bool,
        /// `.ctype` is `.f32` (else `.f16`).
        c_f32: bool,
    },
    /// `.bf16` inputs, `.f32` accumulators.
    Bf16,
    /// `.s8`/`.u8` inputs, `.s32` accumulators.
    Int8 {
        /// `.atype` is `.s8`.
        a_signed: bool,
        /// `.btype` is `.s8`.
        b_signed: bool,
        /// `.satfinite`: clamp to the s32 range instead of wrapping.
        satfinite: bool,
    },
}

/// `mma.sync.aligned.mMnNkK.row.col...`: the operand registers of one lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mma {
    /// Rows of A and D.
    pub m: u8,
    /// Columns of B and D.
    pub n: u8,
    /// Columns of A, rows of B.
    pub k: u8,
    /// The element types.
    pub kind: MmaKind,
    /// Destination registers.
    pub d: Vec<u16>,
    /// A's fragment registers.
    pub a: Vec<u16>,
    /// B's fragment registers.
    pub b: Vec<u16>,
    /// C's fragment registers.
    pub c: Vec<u16>,
}

/// A decoded instruction's operation. Fields are named as in the PTX ISA: `d` the
/// destination register, `a`, `b`, `c` the sources, `ty` the instruction type, `ftz`
/// flush-to-zero.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `mov` (also `cvta.to.*`, an identity here) incl. vector packing/unpacking.
    Mov { ty: Ty, d: Operand, a: Operand },
    /// `ld.space.[vN.]ty` into the registers of `d` (one, or a vector).
    Ld {
        space: Space,
        ty: Ty,
        d: Vec<Option<u16>>,
        addr: Addr,
    },
    /// `st.space.[vN.]ty` of the values of `a`.
    St {
        space: Space,
        ty: Ty,
        a: Vec<Operand>,
        addr: Addr,
    },
    /// Two-operand arithmetic/logic.
    Bin {
        op: BinOp,
        ty: Ty,
        ftz: bool,
        d: u16,
        a: Operand,
        b: Operand,
    },
    /// `mad.lo`/`mad.hi`/`mad.wide` (integers) and `fma.rn`/`mad.rn` (floats).
    Mad {
        mode: BinOp,
        ty: Ty,
        ftz: bool,
        d: u16,
        a: Operand,
        b: Operand,
        c: Operand,
    },
    /// One-operand operations.
    Un {
        op: UnOp,
        ty: Ty,
        ftz: bool,
        d: u16,
        a: Operand,
    },
    /// `setp.cmp.ty d, a, b`.
    Setp {
        cmp: Cmp,
        ty: Ty,
        ftz: bool,
        d: u16,
        a: Operand,
        b: Operand,
    },
    /// Predicate logic.
    Pred {
        op: PredOp,
        d: u16,
        a: Operand,
        b: Operand,
    },
    /// `selp.ty d, a, b, c`: `c ? a : b`.
    Selp {
        ty: Ty,
        d: u16,
        a: Operand,
        b: Operand,
        c: Operand,
    },
    /// `cvt[.rnd][.ftz][.sat].dty.sty d, a`.
    Cvt {
        dty: Ty,
        sty: Ty,
        rnd: Option<Rnd>,
        ftz: bool,
        sat: bool,
        d: u16,
        a: Operand,
    },
    /// `bfe.ty d, a, pos, len`.
    Bfe {
        ty: Ty,
        d: u16,
        a: Operand,
        b: Operand,
        c: Operand,
    },
    /// `dp4a.aty.bty d, a, b, c`.
    Dp4a {
        a_signed: bool,
        b_signed: bool,
        d: u16,
        a: Operand,
        b: Operand,
        c: Operand,
    },
    /// `shfl.sync.mode.b32 d, a, b, c, membermask`.
    Shfl {
        mode: ShflMode,
        d: u16,
        a: Operand,
        b: Operand,
        c: Operand,
        mask: Operand,
    },
    /// f16/bf16 arithmetic, scalar or on both halves of a register (`x2`).
    Half {
        op: HalfOp,
        bf16: bool,
        x2: bool,
        ftz: bool,
        sat: bool,
        /// `min.NaN` / `max.NaN`: a NaN operand gives NaN.
        nan: bool,
        d: u16,
        a: Operand,
        b: Operand,
        c: Operand,
    },
    /// `cvt.rn.f16x2.f32 d, a, b` (`bf16x2` with `bf16`): `a` rounded into the upper
    /// half, `b` into the lower.
    CvtPack {
        bf16: bool,
        relu: bool,
        d: u16,
        a: Operand,
        b: Operand,
    },
    /// `prmt.b32[.mode] d, a, b, c`: bytes of `{b, a}` picked by `c`.
    Prmt {
        mode: PrmtMode,
        d: u16,
        a: Operand,
        b: Operand,
        c: Operand,
    },
    /// `lop3.b32 d, a, b, c, lut`: any bitwise function of three inputs.
    Lop3 {
        d: u16,
        a: Operand,
        b: Operand,
        c: Operand,
        lut: u8,
    },
    /// `shf.{l,r}.{clamp,wrap}.b32 d, a, b, c`: the funnel shift of `{b, a}` by `c`.
    Shf {
        left: bool,
        wrap: bool,
        d: u16,
        a: Operand,
        b: Operand,
        c: Operand,
    },
    /// `bfi.ty d, a, b, pos, len`: field `a` inserted into `b`.
    Bfi {
        ty: Ty,
        d: u16,
        a: Operand,
        b: Operand,
        pos: Operand,
        len: Operand,
    },
    /// `popc`, `clz`, `brev`, `bfind` (`shift` is `bfind.shiftamt`).
    Bits {
        op: BitOp,
        ty: Ty,
        shift: bool,
        d: u16,
        a: Operand,
    },
    /// `atom.space.op.ty d, [addr], a[, b]` (`d` is `None` for `red`).
    Atom {
        space: Space,
        op: AtomOp,
        ty: Ty,
        d: Option<u16>,
        addr: Addr,
        a: Operand,
        b: Operand,
    },
    /// `fence.*`, `membar.*`: orders memory; the interpreter runs a block's warps one
    /// at a time and global atomics under a lock, so there is nothing to do.
    Fence,
    /// `mma.sync.aligned` of one warp.
    Mma(Box<Mma>),
    /// `ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16 d, [addr]`: `d.len()` is N.
    Ldmatrix {
        trans: bool,
        d: Vec<u16>,
        addr: Addr,
    },
    /// `cp.async.{ca,cg}.shared.global [dst], [src], size[, src_size]`.
    CpAsync {
        size: u8,
        dst: Addr,
        src: Addr,
        src_size: Option<Operand>,
    },
    /// `cp.async.commit_group`.
    CpAsyncCommit,
    /// `cp.async.wait_group n` (`cp.async.wait_all` is a commit and `n` = 0).
    CpAsyncWait { n: u32, all: bool },
    /// `bar.warp.sync membermask`.
    BarWarpSync { mask: Operand },
    /// `prefetch{.global}.{L1,L2} [a]`: a hint to bring a line into a cache level. It
    /// changes no state (a GPU drops a prefetch of an address it cannot read), so it
    /// runs as a no-op; the address is decoded so that it must be well formed.
    Prefetch { addr: Addr },
    /// `bar.sync 0` / `barrier.sync 0`.
    BarSync,
    /// `griddepcontrol.wait` (sm_90): waits until the grids this one depends on have
    /// completed and their memory is visible. In a launch with programmatic stream
    /// serialisation no thread may touch global memory before it (checked); otherwise it
    /// returns at once. Kernels run one after another here, so it changes no state.
    GridDepWait,
    /// `griddepcontrol.launch_dependents` (sm_90): lets a programmatic dependent grid be
    /// scheduled once every block has run it or exited. A scheduling hint: no state.
    GridDepLaunch,
    /// `bra target` (instruction index).
    Bra { target: u32 },
    /// `call (ret), func, (args)`: caller param offsets copied to the callee's params.
    Call {
        func: u32,
        ret: Option<(u32, u32)>,
        args: Vec<(u32, u32)>,
    },
    /// `ret`.
    Ret,
    /// `exit`.
    Exit,
    /// `trap`.
    Trap,
}

/// An instruction with its guard and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Instr {
    /// `@%p` / `@!%p`: predicate register and whether negated.
    pub guard: Option<(u16, bool)>,
    /// What it does.
    pub op: Op,
    /// 1-based source line.
    pub line: u32,
}

/// A `.entry` or `.func`.
#[derive(Clone, Debug)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// Whether it is a kernel (`.entry`).
    pub is_entry: bool,
    /// The decoded body.
    pub code: Vec<Instr>,
    /// Number of registers (all types; predicates included).
    pub n_regs: usize,
    /// Bytes of per-lane param storage (a `.func`'s params and return, and every
    /// call-scope `.param` declared in the body).
    pub param_bytes: usize,
    /// Offsets in that storage of the `.func`'s parameters, in order, with sizes.
    pub param_slots: Vec<(u32, u32)>,
    /// Offset and size of the return parameter of a `.func`.
    pub ret_slot: Option<(u32, u32)>,
    /// Declared parameters of an `.entry`.
    pub kernel_params: Vec<crate::ptx::Param>,
    /// Offsets of the `.entry`'s parameters in the argument bytes.
    pub kernel_param_offsets: Vec<usize>,
    /// Size of the `.entry`'s argument bytes.
    pub kernel_param_bytes: usize,
}
