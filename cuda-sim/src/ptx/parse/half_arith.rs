//! Half-precision arithmetic (`.f16`, `.bf16` and their `x2` forms).

use super::super::lex::Token;
use super::operands::Dec;
use super::*;

/// f16/bf16 arithmetic (`add`, `sub`, `mul`, `fma`, `min`, `max`, `neg`, `abs`,
/// `ex2.approx` on `.f16`, `.bf16`, `.f16x2`, `.bf16x2`): `None` when `mnem` is not one
/// of them or names no half type.
pub(super) fn decode_half(
    d: &Dec,
    mnem: &str,
    mods: &[&str],
    g: &[&[Token]],
    line: u32,
    opcode: &str,
) -> Result<Option<Op>, PErr> {
    let unsupported = |why: &str| refuse(line, opcode, why);
    let kind = mods.iter().find_map(|m| match *m {
        "f16" => Some((false, false)),
        "bf16" => Some((true, false)),
        "f16x2" => Some((false, true)),
        "bf16x2" => Some((true, true)),
        _ => None,
    });
    let Some((bf16, x2)) = kind else {
        return Ok(None);
    };
    let op = match mnem {
        "add" => HalfOp::Add,
        "sub" => HalfOp::Sub,
        "mul" => HalfOp::Mul,
        "fma" => HalfOp::Fma,
        "min" => HalfOp::Min,
        "max" => HalfOp::Max,
        "neg" => HalfOp::Neg,
        "abs" => HalfOp::Abs,
        "ex2" => HalfOp::Ex2,
        _ => return Ok(None),
    };
    let types = mods
        .iter()
        .filter(|m| matches!(**m, "f16" | "bf16" | "f16x2" | "bf16x2"))
        .count();
    if types != 1 {
        return unsupported("expected one type");
    }
    for m in mods {
        let known = match *m {
            "f16" | "bf16" | "f16x2" | "bf16x2" | "ftz" => true,
            "rn" => matches!(op, HalfOp::Add | HalfOp::Sub | HalfOp::Mul | HalfOp::Fma),
            "sat" => matches!(op, HalfOp::Add | HalfOp::Sub | HalfOp::Mul | HalfOp::Fma) && !bf16,
            "NaN" => matches!(op, HalfOp::Min | HalfOp::Max),
            "approx" => op == HalfOp::Ex2,
            _ => false,
        };
        if !known {
            return unsupported(&format!("modifier '.{m}'"));
        }
    }
    let has = |f: &str| mods.contains(&f);
    if op == HalfOp::Fma && !has("rn") {
        return unsupported("fma needs .rn");
    }
    if op == HalfOp::Ex2 && (!has("approx") || bf16 != has("ftz")) {
        return unsupported("ex2 takes .approx (with .ftz for bf16, without for f16)");
    }
    let n = match op {
        HalfOp::Neg | HalfOp::Abs | HalfOp::Ex2 => 2,
        HalfOp::Fma => 4,
        _ => 3,
    };
    if g.len() != n {
        return err(
            line,
            format!("'{opcode}' takes {n} operands, found {}", g.len()),
        );
    }
    let src = |i: usize| -> Result<Operand, PErr> {
        if i < n {
            d.operand(g[i], Ty::B(32))
        } else {
            Ok(Operand::Imm(0))
        }
    };
    Ok(Some(Op::Half {
        op,
        bf16,
        x2,
        ftz: has("ftz"),
        sat: has("sat"),
        nan: has("NaN"),
        d: d.reg(g[0])?,
        a: src(1)?,
        b: src(2)?,
        c: src(3)?,
    }))
}
