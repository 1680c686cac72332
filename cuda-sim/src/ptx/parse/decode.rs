//! Instruction decoding: the opcode's modifiers and operands to an [`Op`], for the
//! basic instruction set; half-precision and tensor-core forms are in [`super::half_arith`]
//! and [`super::extra`].

use super::super::lex::{Tok, Token};
use super::extra::decode_extra;
use super::half_arith::decode_half;
use super::operands::{tok_word, Dec};
use super::*;

fn rnd_of(m: &str) -> Option<(Rnd, bool)> {
    Some(match m {
        "rn" => (Rnd::Nearest, false),
        "rz" => (Rnd::Zero, false),
        "rm" => (Rnd::Down, false),
        "rp" => (Rnd::Up, false),
        "rni" => (Rnd::Nearest, true),
        "rzi" => (Rnd::Zero, true),
        "rmi" => (Rnd::Down, true),
        "rpi" => (Rnd::Up, true),
        _ => return None,
    })
}

fn cmp_of(m: &str) -> Option<Cmp> {
    Some(match m {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" | "lo" => Cmp::Lt,
        "le" | "ls" => Cmp::Le,
        "gt" | "hi" => Cmp::Gt,
        "ge" | "hs" => Cmp::Ge,
        "equ" => Cmp::Equ,
        "neu" => Cmp::Neu,
        "ltu" => Cmp::Ltu,
        "leu" => Cmp::Leu,
        "gtu" => Cmp::Gtu,
        "geu" => Cmp::Geu,
        "num" => Cmp::Num,
        "nan" => Cmp::Nan,
        _ => return None,
    })
}

#[allow(clippy::too_many_lines)]
pub(super) fn decode(
    p: &mut P<'_>,
    ctx: &mut FnCtx,
    f: &mut Function,
    opcode: &str,
    g: &[&[Token]],
    line: u32,
) -> Result<Op, PErr> {
    let mut parts = opcode.split('.');
    let mnem = parts.next().unwrap_or("");
    // `.shared::cta` is `.shared` (the only shared window a CTA-level instruction sees).
    let mods: Vec<&str> = parts
        .map(|m| if m == "shared::cta" { "shared" } else { m })
        .collect();
    let unsupported = |why: &str| err(line, format!("unsupported instruction '{opcode}': {why}"));
    // Types among the modifiers, in order; the remaining flags.
    let types: Vec<Ty> = mods.iter().filter_map(|m| parse_type(m)).collect();
    let has = |m: &str| mods.contains(&m);
    let ftz = has("ftz");
    let rnd = mods.iter().find_map(|m| rnd_of(m));
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
    let ty1 = || -> Result<Ty, PErr> {
        match types.as_slice() {
            [t] => Ok(*t),
            _ => err(line, format!("'{opcode}': expected one type")),
        }
    };
    // Immutable decoding helpers need `p` and `ctx` borrowed.
    let d = Dec { p, ctx, line };
    let known_flags = |allowed: &[&str]| -> Result<(), PErr> {
        for m in &mods {
            if parse_type(m).is_none() && !allowed.contains(m) {
                return err(
                    line,
                    format!("unsupported instruction '{opcode}': modifier '.{m}'"),
                );
            }
        }
        Ok(())
    };
    if let Some(op) = decode_half(&d, mnem, &mods, g, line, opcode)? {
        return Ok(op);
    }
    if let Some(op) = decode_extra(&d, mnem, &mods, g, line, opcode)? {
        return Ok(op);
    }
    let op = match mnem {
        "mov" => {
            known_flags(&[])?;
            want(2)?;
            let ty = ty1()?;
            Op::Mov {
                ty,
                d: d.operand(g[0], ty)?,
                a: d.operand(g[1], ty)?,
            }
        }
        "cvta" => {
            known_flags(&["to", "global"])?;
            if !has("global") {
                return unsupported("only .global addresses (generic = global in cuda-sim)");
            }
            want(2)?;
            Op::Mov {
                ty: Ty::U(64),
                d: d.operand(g[0], Ty::U(64))?,
                a: d.operand(g[1], Ty::U(64))?,
            }
        }
        "ld" | "st" => {
            known_flags(&[
                "global",
                "shared",
                "local",
                "param",
                "v2",
                "v4",
                "volatile",
                "relaxed",
                "weak",
                "nc",
                "ca",
                "cg",
                "cs",
                "lu",
                "cv",
                "wb",
                "wt",
                "gpu",
                "cta",
                "sys",
                "L2::64B",
                "L2::128B",
                "L2::256B",
                "L1::no_allocate",
                "L1::evict_last",
                "L1::evict_first",
                "L1::evict_normal",
                "L1::evict_unchanged",
            ])?;
            want(2)?;
            let ty = ty1()?;
            let vec = if has("v4") {
                4
            } else if has("v2") {
                2
            } else {
                1
            };
            let (addr_g, val_g) = if mnem == "ld" {
                (g[1], g[0])
            } else {
                (g[0], g[1])
            };
            let (addr, sym_space) = d.addr(addr_g)?;
            let space = if has("global") {
                Space::Global
            } else if has("shared") {
                Space::Shared
            } else if has("local") {
                Space::Local
            } else if has("param") {
                match sym_space {
                    Some(s @ (Space::KernelParam | Space::FuncParam)) => s,
                    _ => return unsupported("a .param access must name a parameter"),
                }
            } else {
                return unsupported("generic addressing: name the state space");
            };
            if let Some(s) = sym_space {
                if s != space {
                    return unsupported("the symbol is in another state space");
                }
            }
            if mnem == "ld" {
                let dst = match d.operand(val_g, ty)? {
                    Operand::Reg(r) if vec == 1 => vec![Some(r)],
                    Operand::Vector(v) if v.len() == vec => v,
                    _ => return unsupported("destination does not match the vector width"),
                };
                Op::Ld {
                    space,
                    ty,
                    d: dst,
                    addr,
                }
            } else {
                let vals = match d.operand(val_g, ty)? {
                    Operand::Vector(v) if v.len() == vec => v
                        .into_iter()
                        .map(|r| {
                            r.map(Operand::Reg)
                                .ok_or((line, "'_' in a store".to_string()))
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    o @ (Operand::Reg(_) | Operand::Imm(_)) if vec == 1 => vec![o],
                    _ => return unsupported("source does not match the vector width"),
                };
                Op::St {
                    space,
                    ty,
                    a: vals,
                    addr,
                }
            }
        }
        "add" | "sub" | "mul" | "div" | "rem" | "and" | "or" | "xor" | "shl" | "shr" | "min"
        | "max" => {
            known_flags(&["lo", "hi", "wide", "rn", "ftz", "full", "approx"])?;
            let ty = ty1()?;
            if ty == Ty::Pred && matches!(mnem, "and" | "or" | "xor") {
                want(3)?;
                return Ok(Op::Pred {
                    op: match mnem {
                        "and" => PredOp::And,
                        "or" => PredOp::Or,
                        _ => PredOp::Xor,
                    },
                    d: d.reg(g[0])?,
                    a: d.operand(g[1], ty)?,
                    b: d.operand(g[2], ty)?,
                });
            }
            if ty.is_float() && ty != Ty::F(32) && ty != Ty::F(64) {
                return unsupported("f16/bf16 arithmetic");
            }
            if ty.is_float() {
                if let Some((r, _)) = rnd {
                    if r != Rnd::Nearest {
                        return unsupported("directed rounding of arithmetic (only .rn)");
                    }
                }
                if has("approx") && mnem != "div" {
                    return unsupported(".approx");
                }
            }
            want(3)?;
            let op = match mnem {
                "add" => BinOp::Add,
                "sub" => BinOp::Sub,
                "mul" if has("wide") => BinOp::MulWide,
                "mul" if has("hi") => BinOp::MulHi,
                "mul" => BinOp::MulLo,
                "div" => BinOp::Div,
                "rem" => BinOp::Rem,
                "and" => BinOp::And,
                "or" => BinOp::Or,
                "xor" => BinOp::Xor,
                "shl" => BinOp::Shl,
                "shr" => BinOp::Shr,
                "min" => BinOp::Min,
                _ => BinOp::Max,
            };
            if mnem == "div" && ty.is_float() && (has("approx") || has("full")) {
                return unsupported("div.approx / div.full (use div.rn)");
            }
            let bty = if matches!(op, BinOp::Shl | BinOp::Shr) {
                Ty::U(32)
            } else {
                ty
            };
            Op::Bin {
                op,
                ty,
                ftz,
                d: d.reg(g[0])?,
                a: d.operand(g[1], ty)?,
                b: d.operand(g[2], bty)?,
            }
        }
        "mad" | "fma" => {
            known_flags(&["lo", "hi", "wide", "rn", "ftz"])?;
            want(4)?;
            let ty = ty1()?;
            if ty.is_float() {
                if ty != Ty::F(32) && ty != Ty::F(64) {
                    return unsupported("f16/bf16 arithmetic");
                }
                if rnd.map(|r| r.0) != Some(Rnd::Nearest) {
                    return unsupported("float fma/mad needs .rn");
                }
            }
            let mode = if ty.is_float() {
                BinOp::MulLo
            } else if has("wide") {
                BinOp::MulWide
            } else if has("hi") {
                BinOp::MulHi
            } else if has("lo") {
                BinOp::MulLo
            } else {
                return unsupported("integer mad needs .lo, .hi or .wide");
            };
            let cty = if mode == BinOp::MulWide { wide(ty) } else { ty };
            Op::Mad {
                mode,
                ty,
                ftz,
                d: d.reg(g[0])?,
                a: d.operand(g[1], ty)?,
                b: d.operand(g[2], ty)?,
                c: d.operand(g[3], cty)?,
            }
        }
        "neg" | "abs" | "not" | "sqrt" | "ex2" | "lg2" | "tanh" | "rcp" | "rsqrt" | "sin"
        | "cos" => {
            known_flags(&["rn", "approx", "ftz", "full"])?;
            want(2)?;
            let ty = ty1()?;
            if ty == Ty::Pred && mnem == "not" {
                return Ok(Op::Pred {
                    op: PredOp::Not,
                    d: d.reg(g[0])?,
                    a: d.operand(g[1], ty)?,
                    b: Operand::Imm(0),
                });
            }
            let op = match (mnem, has("approx")) {
                ("neg", _) => UnOp::Neg,
                ("abs", _) => UnOp::Abs,
                ("not", _) => UnOp::Not,
                ("sqrt", true) => UnOp::SqrtApprox,
                ("sqrt", false) if rnd.map(|r| r.0) == Some(Rnd::Nearest) => UnOp::Sqrt,
                ("rcp", true) => UnOp::RcpApprox,
                ("rcp", false) if rnd.map(|r| r.0) == Some(Rnd::Nearest) => UnOp::Rcp,
                ("ex2", true) => UnOp::Ex2,
                ("lg2", true) => UnOp::Lg2,
                ("tanh", true) => UnOp::Tanh,
                ("rsqrt", true) => UnOp::Rsqrt,
                ("sin", true) => UnOp::Sin,
                ("cos", true) => UnOp::Cos,
                _ => return unsupported("this rounding/approximation form"),
            };
            if matches!(op, UnOp::Neg | UnOp::Abs)
                && ty.is_float()
                && ty != Ty::F(32)
                && ty != Ty::F(64)
            {
                return unsupported("f16/bf16 arithmetic");
            }
            if !matches!(op, UnOp::Neg | UnOp::Abs | UnOp::Not) && ty != Ty::F(32) {
                return unsupported("only .f32");
            }
            Op::Un {
                op,
                ty,
                ftz,
                d: d.reg(g[0])?,
                a: d.operand(g[1], ty)?,
            }
        }
        "setp" => {
            let cmp = mods.first().and_then(|m| cmp_of(m)).ok_or((
                line,
                format!("unsupported instruction '{opcode}': comparison"),
            ))?;
            for m in &mods[1..] {
                if parse_type(m).is_none() && *m != "ftz" {
                    return unsupported(
                        "combining forms (.and/.or with a predicate) are not supported",
                    );
                }
            }
            want(3)?;
            let ty = ty1()?;
            if g[0].len() != 1 {
                return unsupported("the two-destination form p|q");
            }
            Op::Setp {
                cmp,
                ty,
                ftz,
                d: d.reg(g[0])?,
                a: d.operand(g[1], ty)?,
                b: d.operand(g[2], ty)?,
            }
        }
        "selp" => {
            known_flags(&[])?;
            want(4)?;
            let ty = ty1()?;
            Op::Selp {
                ty,
                d: d.reg(g[0])?,
                a: d.operand(g[1], ty)?,
                b: d.operand(g[2], ty)?,
                c: d.operand(g[3], Ty::Pred)?,
            }
        }
        "cvt" => {
            known_flags(&[
                "rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi", "ftz", "sat",
            ])?;
            want(2)?;
            let [dty, sty] = types.as_slice() else {
                return unsupported("cvt needs a destination and a source type");
            };
            let (dty, sty) = (*dty, *sty);
            let r = rnd.map(|(r, _)| r);
            let int_rnd = rnd.is_some_and(|(_, i)| i);
            // Which conversions take which rounding, as the ISA requires.
            match (dty.is_float(), sty.is_float()) {
                (false, true) if !int_rnd => {
                    return unsupported("float to integer needs .rni/.rzi/.rmi/.rpi")
                }
                (true, true) if dty.bits() < sty.bits() && (r.is_none() || int_rnd) => {
                    return unsupported("narrowing float conversion needs .rn/.rz/.rm/.rp")
                }
                (true, true) if dty == sty && !int_rnd && r.is_some() => {
                    return unsupported("same-type float cvt rounds with .rni/.rzi/.rmi/.rpi")
                }
                (true, false) if r.is_none() || int_rnd => {
                    return unsupported("integer to float needs .rn/.rz/.rm/.rp")
                }
                (false, false) if r.is_some() => {
                    return unsupported("integer conversion takes no rounding")
                }
                _ => {}
            }
            if r.is_some_and(|r| r != Rnd::Nearest) && dty.is_float() && !int_rnd {
                return unsupported("directed rounding into a float type (only .rn)");
            }
            if dty == Ty::Pred || sty == Ty::Pred {
                return unsupported("predicate conversion");
            }
            Op::Cvt {
                dty,
                sty,
                rnd: r,
                ftz,
                sat: has("sat"),
                d: d.reg(g[0])?,
                a: d.operand(g[1], sty)?,
            }
        }
        "bfe" => {
            known_flags(&[])?;
            want(4)?;
            let ty = ty1()?;
            Op::Bfe {
                ty,
                d: d.reg(g[0])?,
                a: d.operand(g[1], ty)?,
                b: d.operand(g[2], Ty::U(32))?,
                c: d.operand(g[3], Ty::U(32))?,
            }
        }
        "dp4a" => {
            known_flags(&[])?;
            want(4)?;
            let [a, b] = types.as_slice() else {
                return unsupported("dp4a needs two types");
            };
            Op::Dp4a {
                a_signed: a.is_signed(),
                b_signed: b.is_signed(),
                d: d.reg(g[0])?,
                a: d.operand(g[1], *a)?,
                b: d.operand(g[2], *b)?,
                c: d.operand(g[3], Ty::U(32))?,
            }
        }
        "shfl" => {
            known_flags(&["sync", "up", "down", "bfly", "idx"])?;
            if !has("sync") {
                return unsupported("shfl without .sync");
            }
            let mode = if has("up") {
                ShflMode::Up
            } else if has("down") {
                ShflMode::Down
            } else if has("bfly") {
                ShflMode::Bfly
            } else if has("idx") {
                ShflMode::Idx
            } else {
                return unsupported("shfl mode");
            };
            want(5)?;
            if g[0].len() != 1 {
                return unsupported("the d|p destination form");
            }
            Op::Shfl {
                mode,
                d: d.reg(g[0])?,
                a: d.operand(g[1], Ty::B(32))?,
                b: d.operand(g[2], Ty::U(32))?,
                c: d.operand(g[3], Ty::U(32))?,
                mask: d.operand(g[4], Ty::U(32))?,
            }
        }
        "prefetch" => {
            known_flags(&["global", "L1", "L2", "local"])?;
            if !(has("L1") || has("L2")) {
                return unsupported("prefetch needs a cache level (.L1 or .L2)");
            }
            if has("local") {
                return unsupported("only global prefetches");
            }
            want(1)?;
            let (addr, sym) = d.addr(g[0])?;
            if sym.is_some() {
                return unsupported("a prefetch of a symbol (give an address register)");
            }
            Op::Prefetch { addr }
        }
        "bar" | "barrier" => {
            if mods == ["warp", "sync"] {
                want(1)?;
                Op::BarWarpSync {
                    mask: d.operand(g[0], Ty::U(32))?,
                }
            } else if mods == ["sync"] || mods.is_empty() || mods == ["sync", "aligned"] {
                if g.len() != 1 {
                    return unsupported("bar.sync with a thread count");
                }
                match d.operand(g[0], Ty::U(32))? {
                    Operand::Imm(0) => Op::BarSync,
                    _ => return unsupported("only barrier 0"),
                }
            } else {
                return unsupported("barrier form");
            }
        }
        "bra" => {
            known_flags(&["uni"])?;
            want(1)?;
            let label = match g[0] {
                [t] => tok_word(t)
                    .ok_or((line, "bad label".to_string()))?
                    .to_string(),
                _ => return unsupported("indirect branch"),
            };
            ctx.branch_fixups.push((f.code.len(), label, line));
            Op::Bra { target: u32::MAX }
        }
        "call" => {
            known_flags(&["uni"])?;
            let (ret_g, rest) = match g.first() {
                Some(first)
                    if first.first().map(|t| &t.tok) == Some(&Tok::Punct('(')) && g.len() >= 2 =>
                {
                    (Some(*first), &g[1..])
                }
                _ => (None, g),
            };
            let (fname_g, args_g) = rest
                .split_first()
                .ok_or((line, "call without a function".to_string()))?;
            let fname = match fname_g {
                [t] => tok_word(t)
                    .ok_or((line, "bad function name".to_string()))?
                    .to_string(),
                _ => return unsupported("indirect call"),
            };
            let slot = |name_toks: &[Token]| -> Result<(u32, u32), PErr> {
                let n = match name_toks {
                    [t] => tok_word(t).ok_or((line, "bad call argument".to_string()))?,
                    _ => return err(line, "call arguments must be .param variables"),
                };
                let s = ctx
                    .params
                    .get(n)
                    .ok_or((line, format!("'{n}' is not a .param of this scope")))?;
                if s.space != Space::FuncParam {
                    return err(line, "call arguments must be call-scope .param variables");
                }
                Ok((s.offset as u32, s.size as u32))
            };
            let inner = |g: &[Token]| -> Result<Vec<(u32, u32)>, PErr> {
                match g {
                    [Token {
                        tok: Tok::Punct('('),
                        ..
                    }, inner @ .., Token {
                        tok: Tok::Punct(')'),
                        ..
                    }] => inner
                        .split(|t| t.tok == Tok::Punct(','))
                        .filter(|s| !s.is_empty())
                        .map(slot)
                        .collect(),
                    _ => err(line, "expected (...)"),
                }
            };
            let ret = match ret_g {
                Some(r) => {
                    let v = inner(r)?;
                    if v.len() != 1 {
                        return unsupported("one return value at most");
                    }
                    Some(v[0])
                }
                None => None,
            };
            let args = match args_g {
                [] => Vec::new(),
                [a] => inner(a)?,
                _ => return unsupported("call argument list"),
            };
            p.call_fixups
                .push((p.funcs.len(), f.code.len(), fname, line));
            Op::Call {
                func: u32::MAX,
                ret,
                args,
            }
        }
        "ret" => {
            known_flags(&["uni"])?;
            want(0)?;
            if ctx.is_entry {
                Op::Exit
            } else {
                Op::Ret
            }
        }
        "exit" => {
            want(0)?;
            Op::Exit
        }
        "griddepcontrol" => {
            want(0)?;
            match mods.as_slice() {
                ["wait"] => Op::GridDepWait,
                ["launch_dependents"] => Op::GridDepLaunch,
                _ => return unsupported("expected griddepcontrol.wait or .launch_dependents"),
            }
        }
        "trap" => {
            want(0)?;
            Op::Trap
        }
        _ => return err(line, format!("unsupported instruction '{opcode}'")),
    };
    Ok(op)
}

fn wide(t: Ty) -> Ty {
    match t {
        Ty::U(b) => Ty::U(b * 2),
        Ty::S(b) => Ty::S(b * 2),
        Ty::B(b) => Ty::B(b * 2),
        other => other,
    }
}
