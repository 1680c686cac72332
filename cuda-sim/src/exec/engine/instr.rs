//! Instruction semantics: what one non-control instruction does to the registers and
//! memory of the lanes that execute it (the warp loop in [`super`] schedules it).

use super::*;

impl BlockRunner<'_> {
    /// Executes a non-control instruction for the lanes of `exec`.
    #[allow(clippy::type_complexity)]
    pub(super) fn exec(
        &mut self,
        ins: &Instr,
        fr: &mut Frame,
        exec: u32,
        group: u32,
        warp: u32,
        live: u32,
    ) -> Result<(), (FaultKind, usize, Option<u64>, String)> {
        let checks = self.l.checks;
        match &ins.op {
            Op::Mov { ty, d, a } => match (d, a) {
                (Operand::Reg(d), Operand::Vector(parts)) => {
                    let pw = ty.bits() / parts.len() as u32;
                    for lane in lanes_of(exec) {
                        let mut v = 0u64;
                        for (i, p) in parts.iter().enumerate() {
                            if let Some(p) = p {
                                let x = fr.regs[*p as usize * 32 + lane];
                                v |= (x & mask_bits(pw)) << (i as u32 * pw);
                            }
                        }
                        fr.regs[*d as usize * 32 + lane] = v;
                    }
                }
                (Operand::Vector(parts), a) => {
                    let pw = ty.bits() / parts.len() as u32;
                    for lane in lanes_of(exec) {
                        let v = self.get(fr, a, warp, lane);
                        for (i, p) in parts.iter().enumerate() {
                            if let Some(p) = p {
                                fr.regs[*p as usize * 32 + lane] =
                                    (v >> (i as u32 * pw)) & mask_bits(pw);
                            }
                        }
                    }
                }
                (Operand::Reg(d), a) => {
                    let x = self.vals(fr, a, warp);
                    let out = dst(fr, *d);
                    for lane in lanes_of(exec) {
                        out[lane] = arith::mask(x[lane], *ty);
                    }
                }
                _ => {}
            },
            Op::Bin {
                op,
                ty,
                ftz,
                d,
                a,
                b,
            } => {
                let (x, y) = (self.vals(fr, a, warp), self.vals(fr, b, warp));
                let out = dst(fr, *d);
                // The integer forms every kernel runs in its address arithmetic, without
                // the per-lane dispatch of `arith::bin` (same results).
                match op {
                    BinOp::Add if !ty.is_float() => {
                        for lane in lanes_of(exec) {
                            out[lane] = arith::mask(x[lane].wrapping_add(y[lane]), *ty);
                        }
                    }
                    BinOp::Sub if !ty.is_float() => {
                        for lane in lanes_of(exec) {
                            out[lane] = arith::mask(x[lane].wrapping_sub(y[lane]), *ty);
                        }
                    }
                    BinOp::MulWide if *ty == Ty::U(32) => {
                        for lane in lanes_of(exec) {
                            out[lane] = (x[lane] & 0xffff_ffff) * (y[lane] & 0xffff_ffff);
                        }
                    }
                    _ => {
                        for lane in lanes_of(exec) {
                            out[lane] = arith::bin(*op, *ty, *ftz, x[lane], y[lane]);
                        }
                    }
                }
            }
            Op::Mad {
                mode,
                ty,
                ftz,
                d,
                a,
                b,
                c,
            } => {
                let (x, y, z) = (
                    self.vals(fr, a, warp),
                    self.vals(fr, b, warp),
                    self.vals(fr, c, warp),
                );
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    out[lane] = arith::mad(*mode, *ty, *ftz, x[lane], y[lane], z[lane]);
                }
            }
            Op::Un { op, ty, ftz, d, a } => {
                let x = self.vals(fr, a, warp);
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    out[lane] = arith::un(*op, *ty, *ftz, x[lane], checks.approx_at_bound);
                }
            }
            Op::Setp {
                cmp,
                ty,
                ftz,
                d,
                a,
                b,
            } => {
                let (x, y) = (self.vals(fr, a, warp), self.vals(fr, b, warp));
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    out[lane] = arith::setp(*cmp, *ty, *ftz, x[lane], y[lane]) as u64;
                }
            }
            Op::Pred { op, d, a, b } => {
                for lane in lanes_of(exec) {
                    let x = self.get(fr, a, warp, lane) != 0;
                    let y = self.get(fr, b, warp, lane) != 0;
                    let r = match op {
                        crate::ptx::ir::PredOp::And => x & y,
                        crate::ptx::ir::PredOp::Or => x | y,
                        crate::ptx::ir::PredOp::Xor => x ^ y,
                        crate::ptx::ir::PredOp::Not => !x,
                    };
                    fr.regs[*d as usize * 32 + lane] = r as u64;
                }
            }
            Op::Selp { ty, d, a, b, c } => {
                let (x, y, p) = (
                    self.vals(fr, a, warp),
                    self.vals(fr, b, warp),
                    self.vals(fr, c, warp),
                );
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    let v = if p[lane] != 0 { x[lane] } else { y[lane] };
                    out[lane] = arith::mask(v, *ty);
                }
            }
            Op::Cvt {
                dty,
                sty,
                rnd,
                ftz,
                sat,
                d,
                a,
            } => {
                let x = self.vals(fr, a, warp);
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    out[lane] = arith::cvt(*dty, *sty, *rnd, *ftz, *sat, x[lane]);
                }
            }
            Op::Bfe { ty, d, a, b, c } => {
                for lane in lanes_of(exec) {
                    let (x, p, n) = (
                        self.get(fr, a, warp, lane),
                        self.get(fr, b, warp, lane),
                        self.get(fr, c, warp, lane),
                    );
                    fr.regs[*d as usize * 32 + lane] = arith::bfe(*ty, x, p, n);
                }
            }
            Op::Dp4a {
                a_signed,
                b_signed,
                d,
                a,
                b,
                c,
            } => {
                for lane in lanes_of(exec) {
                    let (x, y, z) = (
                        self.get(fr, a, warp, lane),
                        self.get(fr, b, warp, lane),
                        self.get(fr, c, warp, lane),
                    );
                    fr.regs[*d as usize * 32 + lane] = arith::dp4a(*a_signed, *b_signed, x, y, z);
                }
            }
            Op::Shfl {
                mode,
                d,
                a,
                b,
                c,
                mask,
            } => {
                if exec == 0 {
                    return Ok(());
                }
                let first = exec.trailing_zeros() as usize;
                if checks.synccheck {
                    let mm = self.get(fr, mask, warp, first) as u32;
                    check_members(mm, exec, group, live).map_err(|m| {
                        (FaultKind::SyncMask, first, None, format!("shfl.sync: {m}"))
                    })?;
                }
                let mut vals = [0u64; 32];
                for lane in lanes_of(live & fr.mask) {
                    vals[lane] = arith::mask(self.get(fr, a, warp, lane), Ty::B(32));
                }
                let mut out = [0u64; 32];
                for lane in lanes_of(exec) {
                    let bval = (self.get(fr, b, warp, lane) & 31) as i32;
                    let cv = self.get(fr, c, warp, lane) as u32;
                    let (cval, segmask) = ((cv & 31) as i32, ((cv >> 8) & 31) as i32);
                    let l = lane as i32;
                    let max_lane = (l & segmask) | (cval & !segmask);
                    let min_lane = l & segmask;
                    let (j, ok) = match mode {
                        ShflMode::Up => (l - bval, l - bval >= max_lane),
                        ShflMode::Down => (l + bval, l + bval <= max_lane),
                        ShflMode::Bfly => (l ^ bval, (l ^ bval) <= max_lane),
                        ShflMode::Idx => {
                            let j = min_lane | (bval & !segmask);
                            (j, j <= max_lane)
                        }
                    };
                    let j = if ok { j as usize } else { lane };
                    if checks.synccheck && exec & (1 << j) == 0 {
                        return Err((
                            FaultKind::SyncMask,
                            lane,
                            None,
                            format!("shfl.sync read lane {j}, which is not executing it"),
                        ));
                    }
                    out[lane] = vals[j];
                }
                for lane in lanes_of(exec) {
                    fr.regs[*d as usize * 32 + lane] = out[lane];
                }
            }
            Op::BarWarpSync { mask } if exec != 0 && checks.synccheck => {
                let first = exec.trailing_zeros() as usize;
                let mm = self.get(fr, mask, warp, first) as u32;
                check_members(mm, exec, group, live).map_err(|m| {
                    (
                        FaultKind::SyncMask,
                        first,
                        None,
                        format!("bar.warp.sync: {m}"),
                    )
                })?;
            }
            Op::Ld { space, ty, d, addr } => {
                let esz = ty.bytes();
                let total = esz * d.len();
                for lane in lanes_of(exec) {
                    let at = self.addr_of(fr, addr, warp, lane);
                    let mut buf = [0u8; 32];
                    self.load(*space, at, &mut buf[..total], fr, warp, lane)?;
                    for (i, r) in d.iter().enumerate() {
                        if let Some(r) = r {
                            let mut e = [0u8; 8];
                            e[..esz].copy_from_slice(&buf[i * esz..(i + 1) * esz]);
                            let raw = u64::from_le_bytes(e);
                            let v = if ty.is_signed() {
                                arith::sext(raw, *ty) as u64
                            } else {
                                raw
                            };
                            fr.regs[*r as usize * 32 + lane] = v;
                        }
                    }
                }
            }
            Op::St { space, ty, a, addr } => {
                let esz = ty.bytes();
                let total = esz * a.len();
                for lane in lanes_of(exec) {
                    let at = self.addr_of(fr, addr, warp, lane);
                    let mut buf = [0u8; 32];
                    for (i, o) in a.iter().enumerate() {
                        let v = self.get(fr, o, warp, lane);
                        buf[i * esz..(i + 1) * esz].copy_from_slice(&v.to_le_bytes()[..esz]);
                    }
                    self.store(*space, at, &buf[..total], fr, warp, lane)?;
                }
            }
            Op::Half {
                op,
                bf16,
                x2,
                ftz,
                sat,
                nan,
                d,
                a,
                b,
                c,
            } => {
                let (x, y, z) = (
                    self.vals(fr, a, warp),
                    self.vals(fr, b, warp),
                    self.vals(fr, c, warp),
                );
                let out = dst(fr, *d);
                let at_bound = checks.approx_at_bound;
                for lane in lanes_of(exec) {
                    let one = |shift: u32| {
                        half::half_op(
                            *op,
                            *bf16,
                            *ftz,
                            *sat,
                            *nan,
                            x[lane] >> shift,
                            y[lane] >> shift,
                            z[lane] >> shift,
                            at_bound,
                        ) & 0xffff
                    };
                    out[lane] = if *x2 { one(0) | one(16) << 16 } else { one(0) };
                }
            }
            Op::CvtPack {
                bf16,
                relu,
                d,
                a,
                b,
            } => {
                let (x, y) = (self.vals(fr, a, warp), self.vals(fr, b, warp));
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    let hi = half::from_f32(*bf16, *relu, x[lane]);
                    let lo = half::from_f32(*bf16, *relu, y[lane]);
                    out[lane] = hi << 16 | lo;
                }
            }
            Op::Prmt { mode, d, a, b, c } => {
                let (x, y, z) = (
                    self.vals(fr, a, warp),
                    self.vals(fr, b, warp),
                    self.vals(fr, c, warp),
                );
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    out[lane] = bits::prmt(*mode, x[lane], y[lane], z[lane]);
                }
            }
            Op::Lop3 { d, a, b, c, lut } => {
                let (x, y, z) = (
                    self.vals(fr, a, warp),
                    self.vals(fr, b, warp),
                    self.vals(fr, c, warp),
                );
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    out[lane] = bits::lop3(x[lane], y[lane], z[lane], *lut);
                }
            }
            Op::Shf {
                left,
                wrap,
                d,
                a,
                b,
                c,
            } => {
                let (x, y, z) = (
                    self.vals(fr, a, warp),
                    self.vals(fr, b, warp),
                    self.vals(fr, c, warp),
                );
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    out[lane] = bits::shf(*left, *wrap, x[lane], y[lane], z[lane]);
                }
            }
            Op::Bfi {
                ty,
                d,
                a,
                b,
                pos,
                len,
            } => {
                for lane in lanes_of(exec) {
                    let (x, y, p, n) = (
                        self.get(fr, a, warp, lane),
                        self.get(fr, b, warp, lane),
                        self.get(fr, pos, warp, lane),
                        self.get(fr, len, warp, lane),
                    );
                    fr.regs[*d as usize * 32 + lane] = bits::bfi(*ty, x, y, p, n);
                }
            }
            Op::Bits {
                op,
                ty,
                shift,
                d,
                a,
            } => {
                let x = self.vals(fr, a, warp);
                let out = dst(fr, *d);
                for lane in lanes_of(exec) {
                    out[lane] = bits::bits(*op, *ty, *shift, x[lane]);
                }
            }
            Op::Atom {
                space,
                op,
                ty,
                d,
                addr,
                a,
                b,
            } => {
                for lane in lanes_of(exec) {
                    let at = self.addr_of(fr, addr, warp, lane);
                    let (x, y) = (self.get(fr, a, warp, lane), self.get(fr, b, warp, lane));
                    let old = self.atomic(*space, *op, *ty, at, x, y, warp, lane)?;
                    if let Some(d) = d {
                        fr.regs[*d as usize * 32 + lane] = old;
                    }
                }
            }
            Op::Mma(m) => self.mma(m, fr, exec, group, live)?,
            Op::Ldmatrix { trans, d, addr } => {
                self.ldmatrix(*trans, d, addr, fr, exec, group, live, warp)?
            }
            Op::CpAsync {
                size,
                dst,
                src,
                src_size,
            } => self.cp_async(*size, dst, src, src_size.as_ref(), fr, exec, warp)?,
            Op::CpAsyncCommit => {
                for lane in lanes_of(exec) {
                    let t = &mut self.asyncs[warp as usize * 32 + lane];
                    let open = std::mem::take(&mut t.open);
                    t.groups.push_back(open);
                }
            }
            Op::CpAsyncWait { n, all } => {
                for lane in lanes_of(exec) {
                    self.cp_async_wait(warp, lane, *n as usize, *all)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn mask_bits(w: u32) -> u64 {
    if w >= 64 {
        u64::MAX
    } else {
        (1u64 << w) - 1
    }
}

/// synccheck of a member mask: every executing lane is named, and every live lane named
/// is executing.
fn check_members(members: u32, exec: u32, group: u32, live: u32) -> Result<(), String> {
    if exec & !members != 0 {
        return Err(format!(
            "lanes {:#010x} execute it but are not in the member mask {members:#010x}",
            exec & !members
        ));
    }
    let missing = members & live & !exec;
    if missing != 0 {
        return Err(format!(
            "member mask {members:#010x} names lanes {missing:#010x} that are not executing it (executing: {exec:#010x}, converged group {group:#010x})"
        ));
    }
    Ok(())
}
