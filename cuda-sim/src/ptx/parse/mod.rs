//! Tokens to the decoded module ([`super::ir`]). Every construct the emulator does not
//! implement is an error naming the line, never skipped.

use std::collections::HashMap;

use super::ir::*;
use super::lex::{lex, Token};

mod decode;
mod extra;
mod half_arith;
mod module;
mod operands;

/// A parse failure: line and message (the caller adds file and line text).
pub(crate) type PErr = (u32, String);

/// The parsed module before it is wrapped with its file name and source lines.
pub(crate) struct Parsed {
    pub functions: Vec<Function>,
    /// Bytes of `.local` memory per thread (every function's declarations).
    pub local_bytes: usize,
    /// Bytes of static `.shared` memory per block.
    pub shared_bytes: usize,
    /// Offset of the `.extern .shared` array (dynamic shared memory), if declared.
    pub extern_shared: Option<usize>,
    /// The `.target` architecture as `major * 10 + minor` (80 for `sm_80`; 0 if none).
    pub target_sm: u32,
}

struct Sym {
    space: Space,
    offset: u64,
    size: usize,
}

struct P<'a> {
    t: &'a [Token],
    i: usize,
    // module scope
    shared: HashMap<String, Sym>,
    shared_bytes: usize,
    extern_shared: Option<(String, usize)>,
    local_bytes: usize,
    funcs: Vec<Function>,
    func_index: HashMap<String, u32>,
    call_fixups: Vec<(usize, usize, String, u32)>,
    /// `.target sm_XY` as XY (0 before the directive).
    target_sm: u32,
}

fn err<T>(line: u32, msg: impl Into<String>) -> Result<T, PErr> {
    Err((line, msg.into()))
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a.max(1)) * a.max(1)
}

pub(crate) fn parse_type(s: &str) -> Option<Ty> {
    Some(match s {
        "b8" => Ty::B(8),
        "b16" => Ty::B(16),
        "b32" => Ty::B(32),
        "b64" => Ty::B(64),
        "u8" => Ty::U(8),
        "u16" => Ty::U(16),
        "u32" => Ty::U(32),
        "u64" => Ty::U(64),
        "s8" => Ty::S(8),
        "s16" => Ty::S(16),
        "s32" => Ty::S(32),
        "s64" => Ty::S(64),
        "f16" => Ty::F(16),
        "f32" => Ty::F(32),
        "f64" => Ty::F(64),
        "bf16" => Ty::Bf16,
        "pred" => Ty::Pred,
        _ => return None,
    })
}

struct FnCtx {
    regs: HashMap<String, (u16, Ty)>,
    n_regs: usize,
    params: HashMap<String, Sym>,
    param_bytes: usize,
    labels: HashMap<String, u32>,
    branch_fixups: Vec<(usize, String, u32)>,
    local: HashMap<String, Sym>,
    is_entry: bool,
}

/// Placeholder offset of the `.extern .shared` symbol until the module is complete.
const EXTERN_SHARED_MARK: u64 = u64::MAX - 0xffff;
/// Parses a whole module.
pub(crate) fn parse(text: &str) -> Result<Parsed, PErr> {
    let toks = lex(text)?;
    let mut p = P {
        t: &toks,
        i: 0,
        shared: HashMap::new(),
        shared_bytes: 0,
        extern_shared: None,
        local_bytes: 0,
        funcs: Vec::new(),
        func_index: HashMap::new(),
        call_fixups: Vec::new(),
        target_sm: 0,
    };
    p.module()?;
    // ptxas' rule: an instruction newer than the target architecture is an error.
    for f in &p.funcs {
        for ins in &f.code {
            if matches!(ins.op, Op::GridDepWait | Op::GridDepLaunch) && p.target_sm < 90 {
                return err(
                    ins.line,
                    format!(
                        "griddepcontrol requires .target sm_90 or higher (the module targets sm_{})",
                        p.target_sm
                    ),
                );
            }
        }
    }
    for (fi, at, name, line) in std::mem::take(&mut p.call_fixups) {
        let target = *p
            .func_index
            .get(&name)
            .ok_or((line, format!("call of unknown function '{name}'")))?;
        let callee = &p.funcs[target as usize];
        if callee.is_entry {
            return err(line, format!("call of the kernel '{name}'"));
        }
        let (ret_ok, n_args) = (callee.ret_slot.map(|s| s.1), callee.param_slots.len());
        let sizes: Vec<u32> = callee.param_slots.iter().map(|s| s.1).collect();
        if let Op::Call { func, ret, args } = &mut p.funcs[fi].code[at].op {
            if args.len() != n_args || args.iter().zip(&sizes).any(|(a, s)| a.1 != *s) {
                return err(
                    line,
                    format!("call of '{name}' with arguments that do not match its parameters"),
                );
            }
            if ret.map(|r| r.1) != ret_ok && ret.is_some() {
                return err(
                    line,
                    format!("call of '{name}': return value size does not match"),
                );
            }
            *func = target;
        }
    }
    let extern_shared = p
        .extern_shared
        .as_ref()
        .map(|(_, a)| align_up(p.shared_bytes, *a));
    if let Some(off) = extern_shared {
        for f in &mut p.funcs {
            for ins in &mut f.code {
                patch_extern(&mut ins.op, off as u64);
            }
        }
    }
    Ok(Parsed {
        target_sm: p.target_sm,
        functions: p.funcs,
        local_bytes: p.local_bytes,
        shared_bytes: p.shared_bytes,
        extern_shared,
    })
}

fn patch_extern(op: &mut Op, off: u64) {
    let fix_addr = |a: &mut Addr| {
        if a.base == AddrBase::Sym(EXTERN_SHARED_MARK) {
            a.base = AddrBase::Sym(off);
        }
    };
    match op {
        Op::Ld { addr, .. } | Op::St { addr, .. } => fix_addr(addr),
        Op::Mov {
            a: Operand::SymAddr(Space::Shared, o),
            ..
        } if *o == EXTERN_SHARED_MARK => *o = off,
        _ => {}
    }
}

/// The error for an instruction form the emulator does not implement.
fn refuse<T>(line: u32, opcode: &str, why: &str) -> Result<T, PErr> {
    err(line, format!("unsupported instruction '{opcode}': {why}"))
}
