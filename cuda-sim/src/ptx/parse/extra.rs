//! The instructions of the tensor-core kernels beyond the basic set (`mma`, `ldmatrix`,
//! `cp.async`, atomics, fences, bit manipulation).

use super::super::lex::Token;
use super::operands::Dec;
use super::*;

fn reg_vector(d: &Dec, g: &[Token], n: usize, what: &str) -> Result<Vec<u16>, PErr> {
    match d.operand(g, Ty::B(32))? {
        Operand::Vector(v) if v.len() == n && v.iter().all(Option::is_some) => {
            Ok(v.into_iter().flatten().collect())
        }
        _ => err(d.line, format!("{what}: expected {{...}} of {n} registers")),
    }
}

/// An address in `space`, refusing a symbol of another space.
fn addr_in(d: &Dec, g: &[Token], space: Space) -> Result<Addr, PErr> {
    let (addr, sym) = d.addr(g)?;
    match sym {
        Some(s) if s != space => err(d.line, "the symbol is in another state space"),
        _ => Ok(addr),
    }
}

/// The instructions of the tensor-core kernels beyond the basic set: `mma`,
/// `ldmatrix`, `cp.async`, `atom`/`red`, `fence`/`membar`, `prmt`, `lop3`, `shf`, `bfi`,
/// `popc`, `clz`, `brev`, `bfind`, `cvt.rn.{f16x2,bf16x2}.f32`. `None` for others.
#[allow(clippy::too_many_lines)]
pub(super) fn decode_extra(
    d: &Dec,
    mnem: &str,
    mods: &[&str],
    g: &[&[Token]],
    line: u32,
    opcode: &str,
) -> Result<Option<Op>, PErr> {
    let unsupported = |why: &str| refuse(line, opcode, why);
    let has = |m: &str| mods.contains(&m);
    let want = |n: usize| -> Result<(), PErr> {
        if g.len() == n {
            Ok(())
        } else {
            err(
                line,
                format!("'{opcode}' takes {n} operands, found {}", g.len()),
            )
        }
    };
    let only = |allowed: &[&str]| -> Result<(), PErr> {
        match mods.iter().find(|m| !allowed.contains(m)) {
            Some(m) => refuse(line, opcode, &format!("modifier '.{m}'")),
            None => Ok(()),
        }
    };
    let types: Vec<Ty> = mods.iter().filter_map(|m| parse_type(m)).collect();
    let b32 = Ty::B(32);
    let op = match mnem {
        "cvt" if has("f16x2") || has("bf16x2") => {
            only(&["rn", "relu", "f16x2", "bf16x2", "f32"])?;
            if !has("rn") || !has("f32") {
                return unsupported("the packing conversion is cvt.rn[.relu].{f16x2,bf16x2}.f32");
            }
            want(3)?;
            Op::CvtPack {
                bf16: has("bf16x2"),
                relu: has("relu"),
                d: d.reg(g[0])?,
                a: d.operand(g[1], Ty::F(32))?,
                b: d.operand(g[2], Ty::F(32))?,
            }
        }
        "prmt" => {
            let mode = match mods.iter().find(|m| **m != "b32") {
                None => PrmtMode::Generic,
                Some(&"f4e") => PrmtMode::F4e,
                Some(&"b4e") => PrmtMode::B4e,
                Some(&"rc8") => PrmtMode::Rc8,
                Some(&"ecl") => PrmtMode::Ecl,
                Some(&"ecr") => PrmtMode::Ecr,
                Some(&"rc16") => PrmtMode::Rc16,
                Some(m) => return unsupported(&format!("modifier '.{m}'")),
            };
            if !has("b32") || mods.len() > 2 {
                return unsupported("prmt.b32[.mode]");
            }
            want(4)?;
            Op::Prmt {
                mode,
                d: d.reg(g[0])?,
                a: d.operand(g[1], b32)?,
                b: d.operand(g[2], b32)?,
                c: d.operand(g[3], b32)?,
            }
        }
        "lop3" => {
            only(&["b32"])?;
            want(5)?;
            let lut = match d.operand(g[4], b32)? {
                Operand::Imm(v) if v <= 0xff => v as u8,
                _ => return unsupported("the lookup table must be an immediate 0..255"),
            };
            Op::Lop3 {
                d: d.reg(g[0])?,
                a: d.operand(g[1], b32)?,
                b: d.operand(g[2], b32)?,
                c: d.operand(g[3], b32)?,
                lut,
            }
        }
        "shf" => {
            only(&["l", "r", "clamp", "wrap", "b32"])?;
            if has("l") == has("r") || has("clamp") == has("wrap") || !has("b32") {
                return unsupported("shf.{l,r}.{clamp,wrap}.b32");
            }
            want(4)?;
            Op::Shf {
                left: has("l"),
                wrap: has("wrap"),
                d: d.reg(g[0])?,
                a: d.operand(g[1], b32)?,
                b: d.operand(g[2], b32)?,
                c: d.operand(g[3], Ty::U(32))?,
            }
        }
        "bfi" => {
            only(&["b32", "b64"])?;
            want(5)?;
            let [ty] = types.as_slice() else {
                return unsupported("bfi.{b32,b64}");
            };
            Op::Bfi {
                ty: *ty,
                d: d.reg(g[0])?,
                a: d.operand(g[1], *ty)?,
                b: d.operand(g[2], *ty)?,
                pos: d.operand(g[3], Ty::U(32))?,
                len: d.operand(g[4], Ty::U(32))?,
            }
        }
        "popc" | "clz" | "brev" | "bfind" => {
            let op = match mnem {
                "popc" => BitOp::Popc,
                "clz" => BitOp::Clz,
                "brev" => BitOp::Brev,
                _ => BitOp::Bfind,
            };
            let allowed: &[&str] = if op == BitOp::Bfind {
                &["u32", "u64", "s32", "s64", "shiftamt"]
            } else {
                &["b32", "b64"]
            };
            only(allowed)?;
            want(2)?;
            let [ty] = types.as_slice() else {
                return unsupported("expected one type");
            };
            Op::Bits {
                op,
                ty: *ty,
                shift: has("shiftamt"),
                d: d.reg(g[0])?,
                a: d.operand(g[1], *ty)?,
            }
        }
        "fence" | "membar" => {
            only(&[
                "sc", "acq_rel", "cta", "gpu", "sys", "gl", "proxy", "async", "alias",
            ])?;
            want(0)?;
            Op::Fence
        }
        "atom" | "red" => {
            only(&[
                "global", "shared", "add", "inc", "dec", "min", "max", "and", "or", "xor", "exch",
                "cas", "relaxed", "acquire", "release", "acq_rel", "cta", "gpu", "sys", "u32",
                "s32", "u64", "s64", "b32", "b64", "f32",
            ])?;
            let space = match (has("global"), has("shared")) {
                (true, false) => Space::Global,
                (false, true) => Space::Shared,
                _ => return unsupported("name the state space: .global or .shared"),
            };
            let ops = [
                ("add", AtomOp::Add),
                ("inc", AtomOp::Inc),
                ("dec", AtomOp::Dec),
                ("min", AtomOp::Min),
                ("max", AtomOp::Max),
                ("and", AtomOp::And),
                ("or", AtomOp::Or),
                ("xor", AtomOp::Xor),
                ("exch", AtomOp::Exch),
                ("cas", AtomOp::Cas),
            ];
            let found: Vec<AtomOp> = ops
                .iter()
                .filter(|(n, _)| has(n))
                .map(|(_, o)| *o)
                .collect();
            let [op] = found.as_slice() else {
                return unsupported("one operation");
            };
            let [ty] = types.as_slice() else {
                return unsupported("one type");
            };
            let (op, ty) = (*op, *ty);
            let ok = match op {
                AtomOp::Add => matches!(ty, Ty::U(32) | Ty::S(32) | Ty::U(64) | Ty::F(32)),
                AtomOp::Inc | AtomOp::Dec => ty == Ty::U(32),
                AtomOp::Min | AtomOp::Max => {
                    matches!(ty, Ty::U(32) | Ty::S(32) | Ty::U(64) | Ty::S(64))
                }
                AtomOp::And | AtomOp::Or | AtomOp::Xor => matches!(ty, Ty::B(32) | Ty::B(64)),
                AtomOp::Exch | AtomOp::Cas => matches!(ty, Ty::B(32) | Ty::B(64)),
            };
            if !ok {
                return unsupported("this operation and type (see the PTX ISA's atom table)");
            }
            let red = mnem == "red";
            if red && op == AtomOp::Cas {
                return unsupported("red has no .cas");
            }
            let n = usize::from(!red) + 2 + usize::from(op == AtomOp::Cas);
            want(n)?;
            let at = usize::from(!red);
            Op::Atom {
                space,
                op,
                ty,
                d: if red { None } else { Some(d.reg(g[0])?) },
                addr: addr_in(d, g[at], space)?,
                a: d.operand(g[at + 1], ty)?,
                b: if op == AtomOp::Cas {
                    d.operand(g[at + 2], ty)?
                } else {
                    Operand::Imm(0)
                },
            }
        }
        "mma" => decode_mma(d, mods, g, line, opcode)?,
        "ldmatrix" => {
            only(&[
                "sync", "aligned", "m8n8", "x1", "x2", "x4", "trans", "shared", "b16",
            ])?;
            if !(has("sync") && has("aligned") && has("m8n8") && has("b16")) {
                return unsupported("ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16");
            }
            if !has("shared") {
                return unsupported("generic addressing: name the state space (.shared)");
            }
            let num = [("x1", 1), ("x2", 2), ("x4", 4)]
                .iter()
                .filter(|(m, _)| has(m))
                .map(|(_, n)| *n)
                .collect::<Vec<usize>>();
            let [num] = num.as_slice() else {
                return unsupported("one of .x1, .x2, .x4");
            };
            want(2)?;
            Op::Ldmatrix {
                trans: has("trans"),
                d: reg_vector(d, g[0], *num, "ldmatrix destination")?,
                addr: addr_in(d, g[1], Space::Shared)?,
            }
        }
        "cp" => {
            if mods.first() != Some(&"async") {
                return unsupported("only cp.async");
            }
            let rest = &mods[1..];
            match rest {
                ["commit_group"] => {
                    want(0)?;
                    Op::CpAsyncCommit
                }
                ["wait_all"] => {
                    want(0)?;
                    Op::CpAsyncWait { n: 0, all: true }
                }
                ["wait_group"] => {
                    want(1)?;
                    match d.operand(g[0], Ty::U(32))? {
                        Operand::Imm(n) if n <= 64 => Op::CpAsyncWait {
                            n: n as u32,
                            all: false,
                        },
                        _ => return unsupported("wait_group takes an immediate count"),
                    }
                }
                _ => {
                    for m in rest {
                        let ok = matches!(*m, "ca" | "cg" | "shared" | "global")
                            || matches!(*m, "L2::64B" | "L2::128B" | "L2::256B");
                        if !ok {
                            return unsupported(&format!("modifier '.{m}'"));
                        }
                    }
                    if has("ca") == has("cg") || !has("shared") || !has("global") {
                        return unsupported("cp.async.{ca,cg}.shared.global");
                    }
                    if g.len() != 3 && g.len() != 4 {
                        return err(line, format!("'{opcode}' takes 3 or 4 operands"));
                    }
                    let size = match d.operand(g[2], Ty::U(32))? {
                        Operand::Imm(n @ (4 | 8 | 16)) => n as u8,
                        _ => return unsupported("cp-size must be 4, 8 or 16"),
                    };
                    if has("cg") && size != 16 {
                        return unsupported(".cg copies 16 bytes");
                    }
                    let src_size = match g.get(3) {
                        None => None,
                        Some(t) => match d.operand(t, Ty::U(32))? {
                            o @ Operand::Reg(_) => Some(o),
                            Operand::Imm(n) if n <= size as u64 => Some(Operand::Imm(n)),
                            _ => {
                                return unsupported(
                                    "src-size is a register or an immediate up to cp-size",
                                )
                            }
                        },
                    };
                    Op::CpAsync {
                        size,
                        dst: addr_in(d, g[0], Space::Shared)?,
                        src: addr_in(d, g[1], Space::Global)?,
                        src_size,
                    }
                }
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(op))
}

/// `mma.sync.aligned.{m16n8k8,m16n8k16,m16n8k32}.row.col[.satfinite].dtype.atype.btype.ctype`.
fn decode_mma(d: &Dec, mods: &[&str], g: &[&[Token]], line: u32, opcode: &str) -> Result<Op, PErr> {
    let unsupported = |why: &str| refuse(line, opcode, why);
    let (head, types) = mods.split_at(mods.len().saturating_sub(4));
    let sat = match head {
        ["sync", "aligned", _, "row", "col"] => false,
        ["sync", "aligned", _, "row", "col", "satfinite"] => true,
        _ => {
            return unsupported(
                "expected mma.sync.aligned.SHAPE.row.col[.satfinite].dtype.atype.btype.ctype",
            )
        }
    };
    let k: u8 = match head[2] {
        "m16n8k8" => 8,
        "m16n8k16" => 16,
        "m16n8k32" => 32,
        s => return unsupported(&format!("shape '{s}' (m16n8k8, m16n8k16, m16n8k32)")),
    };
    let kind = match (types, k) {
        // ptxas requires .dtype == .ctype for these shapes.
        ([dt @ ("f16" | "f32"), "f16", "f16", ct], 8 | 16) if !sat && dt == ct => MmaKind::F16 {
            d_f32: *dt == "f32",
            c_f32: *ct == "f32",
        },
        (["f32", "bf16", "bf16", "f32"], 8 | 16) if !sat => MmaKind::Bf16,
        (["s32", at @ ("s8" | "u8"), bt @ ("s8" | "u8"), "s32"], 16 | 32) => MmaKind::Int8 {
            a_signed: *at == "s8",
            b_signed: *bt == "s8",
            satfinite: sat,
        },
        _ => return unsupported("these types with this shape"),
    };
    if g.len() != 4 {
        return err(
            line,
            format!("'{opcode}' takes 4 operands, found {}", g.len()),
        );
    }
    let (a_regs, b_regs) = match (kind, k) {
        (MmaKind::Int8 { .. }, 16) => (2, 1),
        (MmaKind::Int8 { .. }, _) => (4, 2),
        (_, 8) => (2, 1),
        _ => (4, 2),
    };
    let acc_regs = |f32: bool| if f32 { 4 } else { 2 };
    let (d_regs, c_regs) = match kind {
        MmaKind::F16 { d_f32, c_f32 } => (acc_regs(d_f32), acc_regs(c_f32)),
        _ => (4, 4),
    };
    Ok(Op::Mma(Box::new(Mma {
        m: 16,
        n: 8,
        k,
        kind,
        d: reg_vector(d, g[0], d_regs, "mma destination")?,
        a: reg_vector(d, g[1], a_regs, "mma A")?,
        b: reg_vector(d, g[2], b_regs, "mma B")?,
        c: reg_vector(d, g[3], c_regs, "mma C")?,
    })))
}
