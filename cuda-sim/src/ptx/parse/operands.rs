//! Operand decoding: registers, special registers, immediates, symbols, vectors and
//! addresses, resolved against the function's and the module's declarations.

use super::super::lex::{Tok, Token};
use super::*;

/// Parses a numeric literal: decimal, `0x` hex, `0fXXXXXXXX` f32 bits, `0dXXXXXXXXXXXXXXXX`
/// f64 bits, or a decimal float. Returns the bits and whether it was written as a float
/// in decimal (to convert to the instruction's float type).
pub(super) fn parse_number(s: &str) -> Option<(u64, bool)> {
    let s = s.strip_suffix('U').unwrap_or(s);
    if let Some(h) = s.strip_prefix("0f").or_else(|| s.strip_prefix("0F")) {
        if h.len() == 8 {
            return u32::from_str_radix(h, 16).ok().map(|v| (v as u64, false));
        }
    }
    if let Some(h) = s.strip_prefix("0d").or_else(|| s.strip_prefix("0D")) {
        if h.len() == 16 {
            return u64::from_str_radix(h, 16).ok().map(|v| (v, false));
        }
    }
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok().map(|v| (v, false));
    }
    if s.bytes().all(|c| c.is_ascii_digit()) && !s.is_empty() {
        return s.parse::<u64>().ok().map(|v| (v, false));
    }
    if s.contains('.') || s.contains('e') {
        return s.parse::<f64>().ok().map(|v| (v.to_bits(), true));
    }
    None
}

pub(super) fn tok_word(t: &Token) -> Option<&str> {
    match &t.tok {
        Tok::Word(w) => Some(w),
        _ => None,
    }
}

fn special(name: &str) -> Option<Special> {
    let axis = |s: &str| match s {
        "x" => Some(0u8),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    let (base, ax) = name.split_once('.').unwrap_or((name, ""));
    Some(match base {
        "%tid" => Special::Tid(axis(ax)?),
        "%ntid" => Special::Ntid(axis(ax)?),
        "%ctaid" => Special::Ctaid(axis(ax)?),
        "%nctaid" => Special::Nctaid(axis(ax)?),
        "%laneid" if ax.is_empty() => Special::Laneid,
        "%warpid" if ax.is_empty() => Special::Warpid,
        _ => return None,
    })
}

/// Whether `name` is one of PTX's predefined special registers (the PTX ISA's "Special
/// Registers" chapter), which a `.reg` declaration must not take: ptxas accepts such a
/// declaration and then reads the special register where the code uses the name (seen
/// with `.reg .pred %pm<3>`: the performance-monitor counters `%pm0..%pm2`).
pub(super) fn is_special_register(name: &str) -> bool {
    const NAMES: [&str; 35] = [
        "%tid",
        "%ntid",
        "%laneid",
        "%warpid",
        "%nwarpid",
        "%ctaid",
        "%nctaid",
        "%smid",
        "%nsmid",
        "%gridid",
        "%is_explicit_cluster",
        "%clusterid",
        "%nclusterid",
        "%cluster_ctaid",
        "%cluster_nctaid",
        "%cluster_ctarank",
        "%cluster_nctarank",
        "%lanemask_eq",
        "%lanemask_le",
        "%lanemask_lt",
        "%lanemask_ge",
        "%lanemask_gt",
        "%clock",
        "%clock_hi",
        "%clock64",
        "%globaltimer",
        "%globaltimer_lo",
        "%globaltimer_hi",
        "%total_smem_size",
        "%aggr_smem_size",
        "%dynamic_smem_size",
        "%current_graph_exec",
        "%reserved_smem_offset_begin",
        "%reserved_smem_offset_end",
        "%reserved_smem_offset_cap",
    ];
    // `prefix` then a number below `below` in plain decimal (`%pm3`, not `%pm03`).
    let numbered = |name: &str, prefix: &str, below: u32| {
        name.strip_prefix(prefix).is_some_and(|n| {
            (n == "0" || !n.starts_with('0'))
                && !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
                && n.parse::<u32>().is_ok_and(|v| v < below)
        })
    };
    NAMES.contains(&name)
        || numbered(name, "%pm", 8)
        || name
            .strip_suffix("_64")
            .is_some_and(|n| numbered(n, "%pm", 8))
        || numbered(name, "%envreg", 32)
        || numbered(name, "%reserved_smem_offset_", 2)
}

pub(super) struct Dec<'p, 'a> {
    pub(super) p: &'p P<'a>,
    pub(super) ctx: &'p FnCtx,
    pub(super) line: u32,
}

impl Dec<'_, '_> {
    pub(super) fn reg(&self, g: &[Token]) -> Result<u16, PErr> {
        match g {
            [t] => {
                let w = tok_word(t).ok_or((self.line, "expected a register".to_string()))?;
                self.ctx
                    .regs
                    .get(w)
                    .map(|r| r.0)
                    .ok_or((self.line, format!("unknown register '{w}'")))
            }
            _ => err(self.line, "expected a register"),
        }
    }

    fn symbol(&self, name: &str) -> Option<(Space, u64)> {
        if let Some(s) = self.ctx.params.get(name) {
            return Some((s.space, s.offset));
        }
        if let Some(s) = self.ctx.local.get(name) {
            return Some((s.space, s.offset));
        }
        if let Some(s) = self.p.shared.get(name) {
            return Some((s.space, s.offset));
        }
        if let Some((n, _)) = &self.p.extern_shared {
            if n == name {
                // Resolved to its final offset once every static variable is known.
                return Some((Space::Shared, EXTERN_SHARED_MARK));
            }
        }
        None
    }

    /// An operand, with `ty` converting decimal float literals.
    pub(super) fn operand(&self, g: &[Token], ty: Ty) -> Result<Operand, PErr> {
        let l = self.line;
        match g {
            [] => err(l, "missing operand"),
            [t] => {
                let w = tok_word(t).ok_or((l, "expected an operand".to_string()))?;
                if w.starts_with('%') {
                    if let Some(r) = self.ctx.regs.get(w) {
                        return Ok(Operand::Reg(r.0));
                    }
                    return special(w)
                        .map(Operand::Special)
                        .ok_or((l, format!("unknown register '{w}'")));
                }
                if let Some((bits, is_float)) = parse_number(w) {
                    return Ok(Operand::Imm(imm_for(bits, is_float, ty)));
                }
                if let Some((space, off)) = self.symbol(w) {
                    return Ok(Operand::SymAddr(space, off));
                }
                err(l, format!("unknown operand '{w}'"))
            }
            [Token {
                tok: Tok::Punct('-'),
                ..
            }, t] => {
                let w = tok_word(t).ok_or((l, "expected a number after '-'".to_string()))?;
                let (bits, is_float) = parse_number(w).ok_or((l, format!("bad number '-{w}'")))?;
                if is_float {
                    Ok(Operand::Imm(imm_for(
                        (-f64::from_bits(bits)).to_bits(),
                        true,
                        ty,
                    )))
                } else {
                    Ok(Operand::Imm((bits as i64).wrapping_neg() as u64))
                }
            }
            [Token {
                tok: Tok::Punct('{'),
                ..
            }, inner @ .., Token {
                tok: Tok::Punct('}'),
                ..
            }] => {
                let mut regs = Vec::new();
                for part in inner.split(|t| t.tok == Tok::Punct(',')) {
                    match part {
                        [t] if tok_word(t) == Some("_") => regs.push(None),
                        _ => regs.push(Some(self.reg(part)?)),
                    }
                }
                Ok(Operand::Vector(regs))
            }
            _ => err(l, "unsupported operand form"),
        }
    }

    pub(super) fn addr(&self, g: &[Token]) -> Result<(Addr, Option<Space>), PErr> {
        let l = self.line;
        let inner = match g {
            [Token {
                tok: Tok::Punct('['),
                ..
            }, inner @ .., Token {
                tok: Tok::Punct(']'),
                ..
            }] => inner,
            _ => return err(l, "expected an address [..]"),
        };
        let (first, rest) = inner
            .split_first()
            .ok_or((l, "empty address".to_string()))?;
        let w = tok_word(first).ok_or((l, "bad address".to_string()))?;
        let (base, space) = if let Some(r) = self.ctx.regs.get(w) {
            (AddrBase::Reg(r.0), None)
        } else if let Some((space, off)) = self.symbol(w) {
            (AddrBase::Sym(off), Some(space))
        } else if let Some((v, false)) = parse_number(w) {
            (AddrBase::Sym(v), None)
        } else {
            return err(l, format!("unknown address base '{w}'"));
        };
        let mut offset: i64 = 0;
        let mut sign = 1i64;
        for t in rest {
            match &t.tok {
                Tok::Punct('+') => {}
                Tok::Punct('-') => sign = -sign,
                Tok::Word(n) => {
                    let (v, f) = parse_number(n).ok_or((l, format!("bad offset '{n}'")))?;
                    if f {
                        return err(l, "float address offset");
                    }
                    offset += sign * v as i64;
                    sign = 1;
                }
                _ => return err(l, "bad address"),
            }
        }
        Ok((Addr { base, offset }, space))
    }
}

fn imm_for(bits: u64, is_float: bool, ty: Ty) -> u64 {
    if !is_float {
        return bits;
    }
    let v = f64::from_bits(bits);
    match ty {
        Ty::F(32) => (v as f32).to_bits() as u64,
        Ty::F(16) => crate::exec::arith::narrow_f64(false, v),
        Ty::Bf16 => crate::exec::arith::narrow_f64(true, v),
        _ => bits,
    }
}
