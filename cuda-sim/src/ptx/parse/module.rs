//! Module structure: directives, variable and register declarations, function
//! signatures and bodies, labels and call fix-ups. Instructions go to [`super::decode`].

use std::collections::HashMap;

use super::super::lex::Tok;
use super::super::{Param, ParamType};
use super::decode::decode;
use super::*;

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

    pub(super) fn module(&mut self) -> Result<(), PErr> {
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
                    let arch = self.word()?;
                    let sm = arch
                        .strip_prefix("sm_")
                        .map(|n| n.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
                        .and_then(|n| n.parse::<u32>().ok())
                        .ok_or((l, format!("unknown target architecture '{arch}'")))?;
                    self.target_sm = sm;
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
                if super::operands::is_special_register(&n) {
                    return err(
                        l,
                        format!(
                            "register '{n}' takes the name of a PTX special register: \
                             ptxas would read the special register where the code uses \
                             it; rename it"
                        ),
                    );
                }
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
