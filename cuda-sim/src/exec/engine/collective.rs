//! The instructions that touch more than one lane's registers or memory in one step:
//! `mma.sync` and `ldmatrix.sync` (warp-wide, all 32 lanes), `cp.async` with its commit
//! and wait groups, and atomics.

use super::{lanes_of, Access, AsyncCopy, BlockRunner, Frame};
use crate::fault::FaultKind;
use crate::ptx::ir::{Addr, AtomOp, BinOp, Mma, MmaKind, Operand, Space, Ty};
use crate::tensor::fragment::{fragment_table, Matrix};
use crate::tensor::model::{
    at_bound_finite, dot_at_bound, dot_at_bound_f16, f16_to_f32, f32_to_f16, finite_f32, int_acc,
    Fin, HalfInput,
};

type Fault = (FaultKind, usize, Option<u64>, String);

impl BlockRunner<'_> {
    /// synccheck of a `.sync.aligned` warp-wide instruction: every lane of the warp
    /// executes it, together.
    fn whole_warp(&self, what: &str, exec: u32, group: u32, live: u32) -> Result<(), Fault> {
        if self.l.checks.synccheck && exec != u32::MAX {
            let lane = (!exec).trailing_zeros().min(31) as usize;
            return Err((
                FaultKind::SyncMask,
                lane,
                None,
                format!(
                    "{what} needs all 32 lanes of the warp executing it together; lanes {exec:#010x} do (live {live:#010x}, converged {group:#010x})"
                ),
            ));
        }
        Ok(())
    }

    /// `mma.sync.aligned.m16n8kK`: gathers A, B and C from the lanes' fragments (the
    /// layouts of [`crate::tensor::fragment`]), computes D and scatters it.
    pub(super) fn mma(
        &mut self,
        m: &Mma,
        fr: &mut Frame,
        exec: u32,
        group: u32,
        live: u32,
    ) -> Result<(), Fault> {
        if exec == 0 {
            return Ok(());
        }
        self.whole_warp("mma.sync.aligned", exec, group, live)?;
        let k = m.k as u32;
        let kk = k as usize;
        let reg = |r: u16, lane: u32| fr.regs[r as usize * 32 + lane as usize];
        let elem_bits = match m.kind {
            MmaKind::Int8 { .. } => 8,
            _ => 16,
        };
        let per_reg = 32 / elem_bits;
        // A (16 x k) and B (k x 8) as raw element bits, C as 32-bit (f16 C widened to f32).
        let mut a = [0u16; 16 * 32];
        let mut b = [0u16; 32 * 8];
        let mut c = [0u32; 128];
        let elem = |word: u64, i: u32| {
            (word >> ((i % per_reg) * elem_bits)) as u16 & ((1u32 << elem_bits) - 1) as u16
        };
        let table = |matrix| fragment_table(matrix, k, elem_bits).expect("a decoded shape");
        let (ta, tb, tc) = (table(Matrix::A), table(Matrix::B), table(Matrix::C));
        let (ea, eb) = (ta.len() / 32, tb.len() / 32);
        let c_f16 = matches!(m.kind, MmaKind::F16 { c_f32: false, .. });
        for lane in 0..32u32 {
            let l = lane as usize;
            for (i, &at) in ta[l * ea..(l + 1) * ea].iter().enumerate() {
                let i = i as u32;
                a[at as usize] = elem(reg(m.a[(i / per_reg) as usize], lane), i);
            }
            for (i, &at) in tb[l * eb..(l + 1) * eb].iter().enumerate() {
                let i = i as u32;
                b[at as usize] = elem(reg(m.b[(i / per_reg) as usize], lane), i);
            }
            for (i, &at) in tc[l * 4..l * 4 + 4].iter().enumerate() {
                c[at as usize] = if c_f16 {
                    let w = reg(m.c[i / 2], lane);
                    f16_to_f32((w >> (16 * (i % 2))) as u16)
                } else {
                    reg(m.c[i], lane) as u32
                };
            }
        }
        let at_bound = self.l.checks.approx_at_bound;
        let model = self.l.checks.mma;
        let mut d = [0u32; 128];
        match m.kind {
            MmaKind::Int8 {
                a_signed,
                b_signed,
                satfinite,
            } => {
                // Rows of A and columns of B as signed or unsigned values, contiguous.
                let val = |x: u16, signed: bool| {
                    if signed {
                        x as u8 as i8 as i32
                    } else {
                        x as u8 as i32
                    }
                };
                let mut ra = [0i32; 16 * 32];
                let mut cb = [0i32; 8 * 32];
                for (i, v) in ra.iter_mut().take(16 * kk).enumerate() {
                    *v = val(a[i], a_signed);
                }
                for (i, &x) in b.iter().take(kk * 8).enumerate() {
                    cb[(i % 8) * kk + i / 8] = val(x, b_signed);
                }
                for row in 0..16 {
                    let ar = &ra[row * kk..(row + 1) * kk];
                    for n in 0..8 {
                        let bc = &cb[n * kk..(n + 1) * kk];
                        let dot: i64 = ar.iter().zip(bc).map(|(&x, &y)| (x * y) as i64).sum();
                        d[row * 8 + n] = int_acc(c[row * 8 + n], dot, satfinite);
                    }
                }
            }
            kind => {
                let input = if kind == MmaKind::Bf16 {
                    HalfInput::Bf16
                } else {
                    HalfInput::F16
                };
                let d_f32 = !matches!(kind, MmaKind::F16 { d_f32: false, .. });
                // Each input decoded once: rows of A, columns of B (k-contiguous), and
                // which rows and columns hold an infinity or NaN (those elements take
                // the general path, with the special-value rules).
                let decode = |x: u16| input.finite(x);
                let mut fa = [Fin::default(); 16 * 32];
                let mut fb = [Fin::default(); 8 * 32];
                let mut row_ok = [true; 16];
                let mut col_ok = [true; 8];
                for (i, &x) in a.iter().take(16 * kk).enumerate() {
                    match decode(x) {
                        Some(f) => fa[i] = f,
                        None => row_ok[i / kk] = false,
                    }
                }
                for (i, &x) in b.iter().take(kk * 8).enumerate() {
                    let (kv, n) = (i / 8, i % 8);
                    match decode(x) {
                        Some(f) => fb[n * kk + kv] = f,
                        None => col_ok[n] = false,
                    }
                }
                let (mut va, mut vb) = ([0f64; 16 * 32], [0f64; 8 * 32]);
                if at_bound {
                    for (v, f) in va.iter_mut().zip(&fa).take(16 * kk) {
                        *v = f.value();
                    }
                    for (v, f) in vb.iter_mut().zip(&fb).take(8 * kk) {
                        *v = f.value();
                    }
                }
                let mut col_bits = [0u16; 32];
                let col_bits = &mut col_bits[..kk];
                for row in 0..16 {
                    for n in 0..8 {
                        let cv = c[row * 8 + n];
                        let (ra, rb) = (row * kk..(row + 1) * kk, n * kk..(n + 1) * kk);
                        d[row * 8 + n] = if row_ok[row] && col_ok[n] && finite_f32(cv) {
                            match (at_bound, d_f32) {
                                (true, _) => at_bound_finite(cv, &va[ra], &vb[rb], !d_f32),
                                (false, true) => model.dot_finite(cv, &fa[ra], &fb[rb]),
                                (false, false) => {
                                    f32_to_f16(model.dot_finite(cv, &fa[ra], &fb[rb])) as u32
                                }
                            }
                        } else {
                            for (kv, v) in col_bits.iter_mut().enumerate() {
                                *v = b[kv * 8 + n];
                            }
                            let row_a = &a[ra];
                            match (at_bound, d_f32) {
                                (true, true) => dot_at_bound(input, cv, row_a, col_bits),
                                (true, false) => {
                                    dot_at_bound_f16(input, cv, row_a, col_bits) as u32
                                }
                                (false, true) => model.dot(input, cv, row_a, col_bits),
                                (false, false) => {
                                    f32_to_f16(model.dot(input, cv, row_a, col_bits)) as u32
                                }
                            }
                        };
                    }
                }
            }
        }
        let d_f16 = matches!(m.kind, MmaKind::F16 { d_f32: false, .. });
        for lane in lanes_of(exec) {
            let mut words = [0u64; 4];
            for (i, &at) in tc[lane * 4..lane * 4 + 4].iter().enumerate() {
                let v = d[at as usize] as u64;
                if d_f16 {
                    words[i / 2] |= (v & 0xffff) << (16 * (i % 2));
                } else {
                    words[i] = v;
                }
            }
            for (j, &r) in m.d.iter().enumerate() {
                fr.regs[r as usize * 32 + lane] = words[j];
            }
        }
        Ok(())
    }

    /// `ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16`: lanes 8i..8i+7 give the row
    /// addresses of matrix i (16 bytes each); lane L receives, in `d[i]`, elements
    /// (L/4, 2(L%4)) and (L/4, 2(L%4)+1) of matrix i, or with `.trans` elements
    /// (2(L%4), L/4) and (2(L%4)+1, L/4); the first in the low half.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ldmatrix(
        &mut self,
        trans: bool,
        d: &[u16],
        addr: &Addr,
        fr: &mut Frame,
        exec: u32,
        group: u32,
        live: u32,
        warp: u32,
    ) -> Result<(), Fault> {
        if exec == 0 {
            return Ok(());
        }
        self.whole_warp("ldmatrix.sync.aligned", exec, group, live)?;
        let mut rows = [[[0u16; 8]; 8]; 4];
        for (i, matrix) in rows.iter_mut().enumerate().take(d.len()) {
            for (r, row) in matrix.iter_mut().enumerate() {
                let lane = 8 * i + r;
                let at = self.addr_of(fr, addr, warp, lane);
                if at % 16 != 0 {
                    return Err((
                        FaultKind::Misaligned,
                        lane,
                        Some(at),
                        "ldmatrix row address not 16-byte aligned".into(),
                    ));
                }
                let s = self.shared_range(at, 16, lane)?;
                self.race(s, 16, warp, Access::Read, lane, at)?;
                for (j, e) in row.iter_mut().enumerate() {
                    *e = u16::from_le_bytes([self.shared[s + 2 * j], self.shared[s + 2 * j + 1]]);
                }
            }
        }
        for lane in lanes_of(exec) {
            let (g, t) = (lane / 4, 2 * (lane % 4));
            for (i, &r) in d.iter().enumerate() {
                let (lo, hi) = if trans {
                    (rows[i][t][g], rows[i][t + 1][g])
                } else {
                    (rows[i][g][t], rows[i][g][t + 1])
                };
                fr.regs[r as usize * 32 + lane] = (hi as u64) << 16 | lo as u64;
            }
        }
        Ok(())
    }

    /// `cp.async`: checks both ranges now (memcheck, initcheck on the source bytes read,
    /// racecheck on the destination) and reads the source; the bytes land in shared
    /// memory when a wait of the issuing thread covers the copy's group. Until then,
    /// racecheck treats the destination as being written: any access to it faults.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn cp_async(
        &mut self,
        size: u8,
        dst: &Addr,
        src: &Addr,
        src_size: Option<&Operand>,
        fr: &Frame,
        exec: u32,
        warp: u32,
    ) -> Result<(), Fault> {
        let n = size as usize;
        for lane in lanes_of(exec) {
            let d_at = self.addr_of(fr, dst, warp, lane);
            let s_at = self.addr_of(fr, src, warp, lane);
            let valid = match src_size {
                None => n,
                Some(o) => {
                    let v = self.get(fr, o, warp, lane) & 0xffff_ffff;
                    if v > n as u64 {
                        return Err((
                            FaultKind::IllegalInstruction,
                            lane,
                            Some(s_at),
                            format!("cp.async src-size {v} exceeds cp-size {n}"),
                        ));
                    }
                    v as usize
                }
            };
            self.check_align(d_at, n, lane)?;
            let s = self.shared_range(d_at, n, lane)?;
            let mut data = [0u8; 16];
            if valid > 0 {
                self.check_align(s_at, n, lane)?;
                let r = self.region(s_at, valid, lane)?;
                if !r.read(s_at, &mut data[..valid]) && self.l.checks.initcheck {
                    return Err((
                        FaultKind::UninitializedRead,
                        lane,
                        Some(s_at),
                        format!("cp.async reads {valid} bytes of device memory never written"),
                    ));
                }
            }
            if self.l.checks.racecheck {
                self.race(s, n, warp, Access::Write, lane, d_at)?;
                self.pending[s..s + n].fill(warp as u16 + 1);
            }
            self.asyncs[warp as usize * 32 + lane].open.push(AsyncCopy {
                dst: s,
                len: size,
                data,
            });
        }
        Ok(())
    }

    /// `cp.async.wait_group n` (or `wait_all`, which commits first) for one thread:
    /// every group but the `n` most recent lands.
    pub(super) fn cp_async_wait(
        &mut self,
        warp: u32,
        lane: usize,
        n: usize,
        all: bool,
    ) -> Result<(), Fault> {
        let t = warp as usize * 32 + lane;
        if all {
            let open = std::mem::take(&mut self.asyncs[t].open);
            self.asyncs[t].groups.push_back(open);
        }
        while self.asyncs[t].groups.len() > n {
            let group = self.asyncs[t].groups.pop_front().expect("a group");
            for c in &group {
                let len = c.len as usize;
                if self.l.checks.racecheck {
                    self.pending[c.dst..c.dst + len].fill(0);
                    self.race(c.dst, len, warp, Access::Write, lane, c.dst as u64)?;
                }
                self.shared[c.dst..c.dst + len].copy_from_slice(&c.data[..len]);
            }
        }
        Ok(())
    }

    /// One lane's atomic read-modify-write; returns the old value.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic(
        &mut self,
        space: Space,
        op: AtomOp,
        ty: Ty,
        at: u64,
        a: u64,
        b: u64,
        warp: u32,
        lane: usize,
    ) -> Result<u64, Fault> {
        let n = ty.bytes();
        self.check_align(at, n, lane)?;
        let mut buf = [0u8; 8];
        match space {
            Space::Global => {
                let r = self.region(at, n, lane)?;
                let _serial = self.l.atomic_lock.lock().unwrap_or_else(|e| e.into_inner());
                if !r.read(at, &mut buf[..n]) && self.l.checks.initcheck {
                    return Err((
                        FaultKind::UninitializedRead,
                        lane,
                        Some(at),
                        format!("{n}-byte atomic on device memory never written"),
                    ));
                }
                let old = u64::from_le_bytes(buf);
                let new = apply_atom(op, ty, old, a, b);
                r.write(at, &new.to_le_bytes()[..n]);
                Ok(old)
            }
            Space::Shared => {
                let s = self.shared_range(at, n, lane)?;
                self.race(s, n, warp, Access::Atomic, lane, at)?;
                buf[..n].copy_from_slice(&self.shared[s..s + n]);
                let old = u64::from_le_bytes(buf);
                let new = apply_atom(op, ty, old, a, b);
                self.shared[s..s + n].copy_from_slice(&new.to_le_bytes()[..n]);
                Ok(old)
            }
            _ => Err((
                FaultKind::IllegalInstruction,
                lane,
                Some(at),
                "atomic outside global and shared memory".into(),
            )),
        }
    }
}

/// The new value of an atomic: `old op a` (`.cas`: `old == a ? b : old`). `.add.f32`
/// rounds to nearest even and flushes subnormal inputs and results to zero, as the ISA
/// says; `.inc`/`.dec` wrap at `a` as the ISA defines them.
pub(crate) fn apply_atom(op: AtomOp, ty: Ty, old: u64, a: u64, b: u64) -> u64 {
    use crate::exec::arith::{bin, mask, sext};
    let r = match op {
        AtomOp::Add if ty == Ty::F(32) => bin(BinOp::Add, ty, true, old, a),
        AtomOp::Add => old.wrapping_add(a),
        AtomOp::Inc => {
            let (o, a) = (mask(old, ty), mask(a, ty));
            if o >= a {
                0
            } else {
                o + 1
            }
        }
        AtomOp::Dec => {
            let (o, a) = (mask(old, ty), mask(a, ty));
            if o == 0 || o > a {
                a
            } else {
                o - 1
            }
        }
        AtomOp::Min | AtomOp::Max => {
            let pick_old = if ty.is_signed() {
                let (x, y) = (sext(old, ty), sext(a, ty));
                (x <= y) == (op == AtomOp::Min)
            } else {
                let (x, y) = (mask(old, ty), mask(a, ty));
                (x <= y) == (op == AtomOp::Min)
            };
            if pick_old {
                old
            } else {
                a
            }
        }
        AtomOp::And => old & a,
        AtomOp::Or => old | a,
        AtomOp::Xor => old ^ a,
        AtomOp::Exch => a,
        AtomOp::Cas => {
            if mask(old, ty) == mask(a, ty) {
                b
            } else {
                old
            }
        }
    };
    mask(r, ty)
}
