//! Tokens to the decoded module ([`super::ir`]). Every construct the emulator does not
//! implement is an error naming the line, never skipped.

use std::collections::HashMap;

use super::ir::*;
use super::lex::{lex, Tok, Token};
use super::{Param, ParamType};

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

/// Parses a numeric literal: decimal, `0x` hex, `0fXXXXXXXX` f32 bits, `0dXXXXXXXXXXXXXXXX`
/// f64 bits, or a decimal float. Returns the bits and whether it was written as a float
/// in decimal (to convert to the instruction's float type).
fn parse_number(s: &str) -> Option<(u64, bool)> {
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

impl<'a> P<'a> {
    fn line(&self) -> u32 {
        self.t.get(self.i).or(self.t.last()).map_or(0, |t| t.line)
    }

    fn peek(&self) -> Option<&'a Tok> {
        self.t.get(self.i).map(|t| &t.tok)
    }

    fn next(&mut self) -> Result<&'a Tok, PErr> {
        let l = self.line();
        let t = self.t.get(self.i).map(|t| &t.tok);
        self.i += 1;
        t.ok_or((l, "unexpected end of the PTX text".to_string()))
    }

    fn word(&mut self) -> Result<&'a str, PErr> {
        let l = self.line();
        match self.next()? {
            Tok::Word(w) => Ok(w),
            Tok::Punct(c) => err(l, format!("expected a word, found '{c}'")),
            Tok::Str(s) => err(l, format!("expected a word, found the string \"{s}\"")),
        }
    }

    fn punct(&mut self, c: char) -> Result<(), PErr> {
        let l = self.line();
        match self.next()? {
            Tok::Punct(p) if *p == c => Ok(()),
            other => err(l, format!("expected '{c}', found {other:?}")),
        }
    }

    fn is_punct(&self, c: char) -> bool {
        matches!(self.peek(), Some(Tok::Punct(p)) if *p == c)
    }

    fn skip_to_semicolon(&mut self) -> Result<(), PErr> {
        while !self.is_punct(';') {
            self.next()?;
        }
        self.punct(';')
    }

    /// `[.align N] .TYPE name [ '[' N? ']' ] ['<' N '>']`: (align, type, name, count,
    /// range). `count` None means `[]`.
    #[allow(clippy::type_complexity)]
    fn var_decl(
        &mut self,
    ) -> Result<(usize, Ty, String, Option<Option<usize>>, Option<usize>), PErr> {
        let l = self.line();
        let mut align = 0;
        let mut w = self.word()?;
        loop {
            match w {
                ".align" => {
                    align = self
                        .word()?
                        .parse()
                        .map_err(|_| (l, "bad .align".to_string()))?;
                    w = self.word()?;
                }
                ".v2" | ".v4" => return err(l, "vector variables are not supported"),
                _ => break,
            }
        }
        let ty = w
            .strip_prefix('.')
            .and_then(parse_type)
            .ok_or((l, format!("unknown type '{w}'")))?;
        let name = self.word()?.to_string();
        let mut count = None;
        let mut range = None;
        if self.is_punct('[') {
            self.next()?;
            if self.is_punct(']') {
                count = Some(None);
            } else {
                let n = self.word()?;
                count = Some(Some(
                    n.parse()
                        .map_err(|_| (l, format!("bad array size '{n}'")))?,
                ));
            }
            self.punct(']')?;
        } else if self.is_punct('<') {
            self.next()?;
            let n = self.word()?;
            range = Some(
                n.parse()
                    .map_err(|_| (l, format!("bad register count '{n}'")))?,
            );
            self.punct('>')?;
        }
        let align = if align == 0 { ty.bytes() } else { align };
        Ok((align, ty, name, count, range))
    }

    fn module(&mut self) -> Result<(), PErr> {
        while let Some(tok) = self.peek() {
            let l = self.line();
            let Tok::Word(w) = tok else {
                return err(l, format!("unexpected {tok:?} at module scope"));
            };
            match w.as_str() {
                ".version" | ".address_size" => {
                    self.next()?;
                    self.word()?;
                }
                ".target" => {
                    self.next()?;
                    self.word()?;
                    while self.is_punct(',') {
                        self.next()?;
                        self.word()?;
                    }
                }
                ".visible" | ".weak" => {
                    self.next()?;
                }
                ".extern" => {
                    self.next()?;
                    let space = self.word()?;
                    if space != ".shared" {
                        return err(l, format!(".extern {space} is not supported"));
                    }
                    let (align, _, name, count, _) = self.var_decl()?;
                    if count != Some(None) {
                        return err(l, ".extern .shared must be an unsized array");
                    }
                    self.punct(';')?;
                    self.fresh_module_name(&name, l)?;
                    // Placed after every static shared variable, known at the end.
                    self.extern_shared = Some((name, align.max(16)));
                }
                ".shared" => {
                    self.next()?;
                    let (align, ty, name, count, _) = self.var_decl()?;
                    self.punct(';')?;
                    self.fresh_module_name(&name, l)?;
                    let size = ty.bytes() * count.flatten().unwrap_or(1);
                    let off = align_up(self.shared_bytes, align);
                    self.shared_bytes = off + size;
                    self.shared.insert(
                        name,
                        Sym {
                            space: Space::Shared,
                            offset: off as u64,
                            size,
                        },
                    );
                }
                ".entry" | ".func" => {
                    let is_entry = w == ".entry";
                    self.next()?;
                    self.function(is_entry)?;
                }
                other => return err(l, format!("unsupported module directive '{other}'")),
            }
        }
        Ok(())
    }

    /// An error if `name` already names a module-scope variable or function (ptxas
    /// refuses such a redefinition).
    fn fresh_module_name(&self, name: &str, l: u32) -> Result<(), PErr> {
        let taken = self.shared.contains_key(name)
            || self.func_index.contains_key(name)
            || self.extern_shared.as_ref().is_some_and(|(n, _)| n == name);
        if taken {
            return err(l, format!("'{name}' defined twice"));
        }
        Ok(())
    }

    /// `.param [.align N] .TYPE name[N]?` inside a signature.
    fn sig_param(&mut self) -> Result<(String, Ty, usize, usize), PErr> {
        let l = self.line();
        let w = self.word()?;
        if w != ".param" && w != ".reg" {
            return err(l, format!("expected .param, found '{w}'"));
        }
        if w == ".reg" {
            return err(l, ".reg parameters are not supported");
        }
        let (align, ty, name, count, _) = self.var_decl()?;
        let size = ty.bytes() * count.flatten().unwrap_or(1);
        Ok((name, ty, size, align))
    }

    fn function(&mut self, is_entry: bool) -> Result<(), PErr> {
        let l = self.line();
        let mut ret = None;
        if !is_entry && self.is_punct('(') {
            self.next()?;
            ret = Some(self.sig_param()?);
            self.punct(')')?;
        }
        let name = self.word()?.to_string();
        let mut params = Vec::new();
        if self.is_punct('(') {
            self.next()?;
            while !self.is_punct(')') {
                params.push(self.sig_param()?);
                if self.is_punct(',') {
                    self.next()?;
                }
            }
            self.punct(')')?;
        }
        // Performance directives (.maxntid, .reqntid, .noreturn, ...) before the body.
        while let Some(Tok::Word(w)) = self.peek() {
            if !w.starts_with('.') {
                break;
            }
            self.next()?;
            while let Some(Tok::Word(v)) = self.peek() {
                if v.starts_with('.') {
                    break;
                }
                self.next()?;
                if self.is_punct(',') {
                    self.next()?;
                }
            }
        }
        if self.is_punct(';') {
            return err(
                l,
                format!("function prototype without a body ('{name}') is not supported"),
            );
        }
        let index = self.funcs.len() as u32;
        if self.shared.contains_key(&name)
            || self.extern_shared.as_ref().is_some_and(|(n, _)| *n == name)
        {
            return err(
                l,
                format!("'{name}' defined twice (a shared variable has that name)"),
            );
        }
        if self.func_index.insert(name.clone(), index).is_some() {
            return err(l, format!("'{name}' defined twice"));
        }
        let mut ctx = FnCtx {
            regs: HashMap::new(),
            n_regs: 0,
            params: HashMap::new(),
            param_bytes: 0,
            labels: HashMap::new(),
            branch_fixups: Vec::new(),
            local: HashMap::new(),
            is_entry,
        };
        let mut f = Function {
            name: name.clone(),
            is_entry,
            code: Vec::new(),
            n_regs: 0,
            param_bytes: 0,
            param_slots: Vec::new(),
            ret_slot: None,
            kernel_params: Vec::new(),
            kernel_param_offsets: Vec::new(),
            kernel_param_bytes: 0,
        };
        if is_entry {
            let mut off = 0;
            for (pname, ty, size, align) in params {
                off = align_up(off, align);
                f.kernel_params.push(Param {
                    name: pname.clone(),
                    ty: match ty {
                        Ty::F(_) | Ty::Bf16 => ParamType::Float,
                        Ty::S(_) if size == ty.bytes() => ParamType::Int { signed: true },
                        _ if size == ty.bytes() => ParamType::Int { signed: false },
                        _ => ParamType::Bytes,
                    },
                    size,
                    align,
                });
                f.kernel_param_offsets.push(off);
                ctx.params.insert(
                    pname,
                    Sym {
                        space: Space::KernelParam,
                        offset: off as u64,
                        size,
                    },
                );
                off += size;
            }
            f.kernel_param_bytes = off;
        } else {
            let add = |ctx: &mut FnCtx, pname: String, size: usize, align: usize| {
                let off = align_up(ctx.param_bytes, align);
                ctx.param_bytes = off + size;
                ctx.params.insert(
                    pname,
                    Sym {
                        space: Space::FuncParam,
                        offset: off as u64,
                        size,
                    },
                );
                (off as u32, size as u32)
            };
            if let Some((rname, _, size, align)) = ret {
                f.ret_slot = Some(add(&mut ctx, rname, size, align));
            }
            for (pname, _, size, align) in params {
                let slot = add(&mut ctx, pname, size, align);
                f.param_slots.push(slot);
            }
        }
        self.punct('{')?;
        self.body(&mut ctx, &mut f)?;
        for (at, label, line) in std::mem::take(&mut ctx.branch_fixups) {
            let target = *ctx
                .labels
                .get(&label)
                .ok_or((line, format!("unknown label '{label}'")))?;
            if let Op::Bra { target: t } = &mut f.code[at].op {
                *t = target;
            }
        }
        f.n_regs = ctx.n_regs;
        f.param_bytes = ctx.param_bytes;
        self.funcs.push(f);
        Ok(())
    }

    fn body(&mut self, ctx: &mut FnCtx, f: &mut Function) -> Result<(), PErr> {
        let mut depth = 1;
        loop {
            let l = self.line();
            match self.next()? {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                Tok::Punct('@') => {
                    let neg = self.is_punct('!');
                    if neg {
                        self.next()?;
                    }
                    let p = self.word()?;
                    let (r, ty) = *ctx
                        .regs
                        .get(p)
                        .ok_or((l, format!("unknown predicate register '{p}'")))?;
                    if ty != Ty::Pred {
                        return err(l, format!("'{p}' is not a predicate"));
                    }
                    let op = self.word()?;
                    let mut ins = self.instruction(ctx, f, op, l)?;
                    ins.guard = Some((r, neg));
                    f.code.push(ins);
                }
                Tok::Punct(c) => return err(l, format!("unexpected '{c}'")),
                Tok::Str(s) => return err(l, format!("unexpected string \"{s}\"")),
                Tok::Word(w) => {
                    if self.is_punct(':') {
                        self.next()?;
                        if ctx.labels.insert(w.clone(), f.code.len() as u32).is_some() {
                            return err(l, format!("label '{w}' defined twice"));
                        }
                        continue;
                    }
                    match w.as_str() {
                        ".reg" => self.reg_decl(ctx)?,
                        ".param" => {
                            let (align, ty, name, count, _) = self.var_decl()?;
                            self.punct(';')?;
                            let size = ty.bytes() * count.flatten().unwrap_or(1);
                            let off = align_up(ctx.param_bytes, align);
                            ctx.param_bytes = off + size;
                            ctx.params.insert(
                                name,
                                Sym {
                                    space: Space::FuncParam,
                                    offset: off as u64,
                                    size,
                                },
                            );
                        }
                        ".local" => {
                            let (align, ty, name, count, _) = self.var_decl()?;
                            self.punct(';')?;
                            let size = ty.bytes() * count.flatten().unwrap_or(1);
                            let off = align_up(self.local_bytes, align);
                            self.local_bytes = off + size;
                            ctx.local.insert(
                                name,
                                Sym {
                                    space: Space::Local,
                                    offset: off as u64,
                                    size,
                                },
                            );
                        }
                        ".shared" => {
                            let (align, ty, name, count, _) = self.var_decl()?;
                            self.punct(';')?;
                            let size = ty.bytes() * count.flatten().unwrap_or(1);
                            let off = align_up(self.shared_bytes, align);
                            self.shared_bytes = off + size;
                            self.shared.insert(
                                name,
                                Sym {
                                    space: Space::Shared,
                                    offset: off as u64,
                                    size,
                                },
                            );
                        }
                        ".pragma" | ".loc" | ".file" => self.skip_to_semicolon()?,
                        d if d.starts_with('.') => {
                            return err(
                                l,
                                format!("unsupported directive '{d}' in a function body"),
                            )
                        }
                        _ => {
                            let ins = self.instruction(ctx, f, w, l)?;
                            f.code.push(ins);
                        }
                    }
                }
            }
        }
    }

    fn reg_decl(&mut self, ctx: &mut FnCtx) -> Result<(), PErr> {
        let l = self.line();
        let tw = self.word()?;
        if tw == ".v2" || tw == ".v4" {
            return err(l, "vector registers are not supported");
        }
        let ty = match tw {
            // A pair of halves lives in a 32-bit register.
            ".f16x2" | ".bf16x2" => Ty::B(32),
            _ => tw
                .strip_prefix('.')
                .and_then(parse_type)
                .ok_or((l, format!("unknown register type '{tw}'")))?,
        };
        loop {
            let name = self.word()?.to_string();
            let add = |ctx: &mut FnCtx, n: String| -> Result<(), PErr> {
                if ctx.n_regs >= u16::MAX as usize {
                    return err(l, "too many registers");
                }
                ctx.regs.insert(n, (ctx.n_regs as u16, ty));
                ctx.n_regs += 1;
                Ok(())
            };
            if self.is_punct('<') {
                self.next()?;
                let n: usize = self
                    .word()?
                    .parse()
                    .map_err(|_| (l, "bad register count".to_string()))?;
                self.punct('>')?;
                for k in 0..n {
                    add(ctx, format!("{name}{k}"))?;
                }
            } else {
                add(ctx, name)?;
            }
            if self.is_punct(',') {
                self.next()?;
                continue;
            }
            break;
        }
        self.punct(';')
    }

    /// The operand tokens up to `;`, split at top-level commas.
    fn operand_groups(&mut self) -> Result<Vec<&'a [Token]>, PErr> {
        let start = self.i;
        let mut depth = 0i32;
        let mut groups = Vec::new();
        let mut gs = start;
        loop {
            let l = self.line();
            match self.next()? {
                Tok::Punct('[') | Tok::Punct('{') | Tok::Punct('(') => depth += 1,
                Tok::Punct(']') | Tok::Punct('}') | Tok::Punct(')') => depth -= 1,
                Tok::Punct(',') if depth == 0 => {
                    groups.push(&self.t[gs..self.i - 1]);
                    gs = self.i;
                }
                Tok::Punct(';') if depth == 0 => {
                    if self.i - 1 > gs {
                        groups.push(&self.t[gs..self.i - 1]);
                    }
                    return Ok(groups);
                }
                _ => {}
            }
            if depth < 0 {
                return err(l, "unbalanced brackets");
            }
        }
    }

    fn instruction(
        &mut self,
        ctx: &mut FnCtx,
        f: &mut Function,
        opcode: &str,
        line: u32,
    ) -> Result<Instr, PErr> {
        let groups = self.operand_groups()?;
        let op = decode(self, ctx, f, opcode, &groups, line)?;
        Ok(Instr {
            guard: None,
            op,
            line,
        })
    }
}

fn tok_word(t: &Token) -> Option<&str> {
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

struct Dec<'p, 'a> {
    p: &'p P<'a>,
    ctx: &'p FnCtx,
    line: u32,
}

impl Dec<'_, '_> {
    fn reg(&self, g: &[Token]) -> Result<u16, PErr> {
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
    fn operand(&self, g: &[Token], ty: Ty) -> Result<Operand, PErr> {
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

    fn addr(&self, g: &[Token]) -> Result<(Addr, Option<Space>), PErr> {
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

/// Placeholder offset of the `.extern .shared` symbol until the module is complete.
const EXTERN_SHARED_MARK: u64 = u64::MAX - 0xffff;

fn imm_for(bits: u64, is_float: bool, ty: Ty) -> u64 {
    if !is_float {
        return bits;
    }
    let v = f64::from_bits(bits);
    match ty {
        Ty::F(32) => (v as f32).to_bits() as u64,
        Ty::F(16) => half::f16::from_f64(v).to_bits() as u64,
        Ty::Bf16 => half::bf16::from_f64(v).to_bits() as u64,
        _ => bits,
    }
}

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
fn decode(
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
    };
    p.module()?;
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

/// f16/bf16 arithmetic (`add`, `sub`, `mul`, `fma`, `min`, `max`, `neg`, `abs`,
/// `ex2.approx` on `.f16`, `.bf16`, `.f16x2`, `.bf16x2`): `None` when `mnem` is not one
/// of them or names no half type.
fn decode_half(
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

/// A brace vector of registers (no `_`) of exactly `n` elements.
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
fn decode_extra(
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
