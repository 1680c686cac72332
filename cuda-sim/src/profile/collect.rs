//! The per-worker counting state the interpreter feeds, one instruction at a time,
//! before the instruction executes (its addresses and sources are read as it sees them).

use std::collections::{HashMap, HashSet};

use super::access::{sectors_and_lines, shared_wavefronts};
use super::class::{InstrClass, MemSpace};
use super::l2::{READ, WRITE};
use super::{Latencies, LaunchCounters, PathCounts};
use crate::ptx::ir::{Addr, AddrBase, Instr, Op, Operand};

/// When a value is ready, and the path that led to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp {
    pub(crate) t: u64,
    pub(crate) path: PathCounts,
}

/// What a launch's worker counted.
pub(crate) struct Collector {
    pub(crate) c: LaunchCounters,
    sectors: HashMap<u64, u8>,
    /// The sectors the running block has read (its idealised L1).
    block_reads: HashSet<u64>,
    lat: Latencies,
    /// The latest block end so far.
    crit: Stamp,
    addrs: Vec<u64>,
    lanes: Vec<(u32, u64)>,
    scratch: Vec<u64>,
}

#[derive(Clone, Copy)]
enum Hop {
    Alu,
    Special,
    Shared,
    Global,
}

fn hop_of(class: InstrClass) -> Hop {
    match class {
        InstrClass::Load { space, .. } => match space {
            MemSpace::Global | MemSpace::Local => Hop::Global,
            MemSpace::Shared => Hop::Shared,
            MemSpace::Param => Hop::Alu,
        },
        InstrClass::Atomic { .. } => Hop::Global,
        InstrClass::ShuffleVote => Hop::Shared,
        InstrClass::Special | InstrClass::Emulated => Hop::Special,
        _ => Hop::Alu,
    }
}

fn operand_regs(o: &Operand, f: &mut impl FnMut(u16)) {
    match o {
        Operand::Reg(r) => f(*r),
        Operand::Vector(v) => v.iter().flatten().for_each(|&r| f(r)),
        Operand::Imm(_) | Operand::Special(_) | Operand::SymAddr(..) => {}
    }
}

fn addr_regs(a: &Addr, f: &mut impl FnMut(u16)) {
    if let AddrBase::Reg(r) = a.base {
        f(r);
    }
}

/// Calls `f` on every register the operation reads.
fn sources(op: &Op, f: &mut impl FnMut(u16)) {
    match op {
        Op::Mov { a, .. } | Op::Un { a, .. } | Op::Cvt { a, .. } => operand_regs(a, f),
        Op::Ld { addr, .. } => addr_regs(addr, f),
        Op::St { a, addr, .. } => {
            a.iter().for_each(|o| operand_regs(o, f));
            addr_regs(addr, f);
        }
        Op::Bin { a, b, .. } | Op::Setp { a, b, .. } | Op::Pred { a, b, .. } => {
            operand_regs(a, f);
            operand_regs(b, f);
        }
        Op::Mad { a, b, c, .. }
        | Op::Selp { a, b, c, .. }
        | Op::Bfe { a, b, c, .. }
        | Op::Dp4a { a, b, c, .. } => {
            operand_regs(a, f);
            operand_regs(b, f);
            operand_regs(c, f);
        }
        Op::Shfl { a, b, c, mask, .. } => {
            for o in [a, b, c, mask] {
                operand_regs(o, f);
            }
        }
        Op::BarWarpSync { mask } => operand_regs(mask, f),
        Op::Atom { addr, b, c, .. } => {
            addr_regs(addr, f);
            operand_regs(b, f);
            if let Some(c) = c {
                operand_regs(c, f);
            }
        }
        Op::Fence
        | Op::BarSync
        | Op::Bra { .. }
        | Op::Call { .. }
        | Op::Ret
        | Op::Exit
        | Op::Trap => {}
    }
}

/// Calls `f` on every register the operation writes.
fn destinations(op: &Op, f: &mut impl FnMut(u16)) {
    match op {
        Op::Mov { d, .. } => operand_regs(d, f),
        Op::Ld { d, .. } => d.iter().flatten().for_each(|&r| f(r)),
        Op::Bin { d, .. }
        | Op::Mad { d, .. }
        | Op::Un { d, .. }
        | Op::Setp { d, .. }
        | Op::Pred { d, .. }
        | Op::Selp { d, .. }
        | Op::Cvt { d, .. }
        | Op::Bfe { d, .. }
        | Op::Dp4a { d, .. }
        | Op::Shfl { d, .. }
        | Op::Atom { d, .. } => f(*d),
        Op::Fence
        | Op::St { .. }
        | Op::BarWarpSync { .. }
        | Op::BarSync
        | Op::Bra { .. }
        | Op::Call { .. }
        | Op::Ret
        | Op::Exit
        | Op::Trap => {}
    }
}

fn lane_addr(regs: &[u64], a: &Addr, lane: usize) -> u64 {
    let base = match a.base {
        AddrBase::Reg(r) => regs[r as usize * 32 + lane],
        AddrBase::Sym(off) => off,
    };
    base.wrapping_add(a.offset as u64)
}

impl Collector {
    pub(crate) fn new(lat: Latencies) -> Collector {
        Collector {
            c: LaunchCounters::default(),
            sectors: HashMap::new(),
            block_reads: HashSet::new(),
            lat,
            crit: Stamp::default(),
            addrs: Vec::with_capacity(32),
            lanes: Vec::with_capacity(32),
            scratch: Vec::with_capacity(64),
        }
    }

    /// Counts instruction `ins`, executed by the lanes of `exec` of a warp whose
    /// registers are `regs` (32 lanes each) and ready stamps `ready`; advances the
    /// warp's issue clock.
    pub(crate) fn instruction(
        &mut self,
        ins: &Instr,
        regs: &[u64],
        ready: &mut [Stamp],
        exec: u32,
        clock: &mut Stamp,
    ) {
        let class = InstrClass::of(&ins.op);
        self.c.warp_instructions += 1;
        self.c.thread_instructions += exec.count_ones() as u64;
        self.c.classes.add(class);
        self.schedule(ins, class, ready, clock);
        if exec == 0 {
            return;
        }
        match (&ins.op, class) {
            (Op::Ld { addr, .. }, InstrClass::Load { space, width })
            | (Op::St { addr, .. }, InstrClass::Store { space, width }) => {
                let write = matches!(ins.op, Op::St { .. });
                match space {
                    MemSpace::Global => self.global(regs, addr, exec, width as u64, write),
                    MemSpace::Shared => self.shared(regs, addr, exec, width as u64, write),
                    MemSpace::Local | MemSpace::Param => {}
                }
            }
            (Op::BarSync, _) => self.c.barriers += 1,
            _ => {}
        }
    }

    fn schedule(&self, ins: &Instr, class: InstrClass, ready: &mut [Stamp], clock: &mut Stamp) {
        let mut issue = *clock;
        issue.t += 1;
        issue.path.issue += 1;
        let mut wait = |r: u16| {
            if let Some(s) = ready.get(r as usize) {
                if *s > issue {
                    issue = *s;
                }
            }
        };
        if let Some((g, _)) = ins.guard {
            wait(g);
        }
        sources(&ins.op, &mut wait);
        *clock = issue;
        let mut done = issue;
        match hop_of(class) {
            Hop::Alu => {
                done.t += self.lat.alu;
                done.path.alu += 1;
            }
            Hop::Special => {
                done.t += self.lat.special;
                done.path.special += 1;
            }
            Hop::Shared => {
                done.t += self.lat.shared;
                done.path.shared += 1;
            }
            Hop::Global => {
                done.t += self.lat.global;
                done.path.global += 1;
            }
        }
        destinations(&ins.op, &mut |r| {
            if let Some(s) = ready.get_mut(r as usize) {
                *s = done;
            }
        });
    }

    fn global(&mut self, regs: &[u64], addr: &Addr, exec: u32, width: u64, write: bool) {
        self.addrs.clear();
        for lane in 0..32 {
            if exec >> lane & 1 != 0 {
                self.addrs.push(lane_addr(regs, addr, lane));
            }
        }
        let lines = sectors_and_lines(&self.addrs, width, &mut self.scratch);
        let t = if write {
            &mut self.c.global_store
        } else {
            &mut self.c.global_load
        };
        t.requests += 1;
        t.sectors += self.scratch.len() as u64;
        t.lines += lines;
        let flag = if write { WRITE } else { READ };
        for &s in &self.scratch {
            *self.sectors.entry(s).or_insert(0) |= flag;
            if write || self.block_reads.insert(s) {
                self.c.l2_sectors += 1;
            }
        }
    }

    fn shared(&mut self, regs: &[u64], addr: &Addr, exec: u32, width: u64, write: bool) {
        self.lanes.clear();
        for lane in 0..32 {
            if exec >> lane & 1 != 0 {
                self.lanes.push((lane as u32, lane_addr(regs, addr, lane)));
            }
        }
        let w = shared_wavefronts(&self.lanes, width);
        let t = if write {
            &mut self.c.shared_store
        } else {
            &mut self.c.shared_load
        };
        t.requests += 1;
        t.wavefronts += w;
    }

    /// A block ended; `end` is the latest last-issue stamp of its warps.
    pub(crate) fn end_block(&mut self, end: Stamp) {
        self.c.blocks_interpreted += 1;
        self.block_reads.clear();
        if end > self.crit {
            self.crit = end;
        }
    }

    /// Adds another worker's counts.
    pub(crate) fn merge(&mut self, o: Collector) {
        let (a, b) = (&mut self.c, o.c);
        a.warp_instructions += b.warp_instructions;
        a.thread_instructions += b.thread_instructions;
        a.classes.merge(&b.classes);
        for (x, y) in [
            (&mut a.global_load, b.global_load),
            (&mut a.global_store, b.global_store),
        ] {
            x.requests += y.requests;
            x.sectors += y.sectors;
            x.lines += y.lines;
        }
        for (x, y) in [
            (&mut a.shared_load, b.shared_load),
            (&mut a.shared_store, b.shared_store),
        ] {
            x.requests += y.requests;
            x.wavefronts += y.wavefronts;
        }
        a.barriers += b.barriers;
        a.l2_sectors += b.l2_sectors;
        a.atomics += b.atomics;
        a.tensor_macs += b.tensor_macs;
        a.blocks_interpreted += b.blocks_interpreted;
        if self.sectors.len() < o.sectors.len() {
            let mine = std::mem::replace(&mut self.sectors, o.sectors);
            for (s, f) in mine {
                *self.sectors.entry(s).or_insert(0) |= f;
            }
        } else {
            for (s, f) in o.sectors {
                *self.sectors.entry(s).or_insert(0) |= f;
            }
        }
        if o.crit > self.crit {
            self.crit = o.crit;
        }
    }

    /// The launch's counters: sums scaled to `blocks` when fewer were interpreted.
    pub(crate) fn finish(mut self, blocks: u64) -> LaunchCounters {
        let mut c = std::mem::take(&mut self.c);
        c.blocks = blocks;
        let mut touched: Vec<(u64, u8)> = self.sectors.into_iter().collect();
        touched.sort_unstable();
        c.unique_read_sectors = touched.iter().filter(|(_, f)| f & READ != 0).count() as u64;
        c.unique_write_sectors = touched.iter().filter(|(_, f)| f & WRITE != 0).count() as u64;
        c.touched = touched;
        c.critical_path = self.crit.path;
        c.critical_path_cycles = self.crit.t;
        if c.sampled() && c.blocks_interpreted > 0 {
            let (n, k) = (c.blocks as u128, c.blocks_interpreted as u128);
            let s = |v: &mut u64| *v = ((*v as u128 * n + k / 2) / k) as u64;
            c.classes.scale(|mut v| {
                s(&mut v);
                v
            });
            for g in [&mut c.global_load, &mut c.global_store] {
                s(&mut g.requests);
                s(&mut g.sectors);
                s(&mut g.lines);
            }
            for t in [&mut c.shared_load, &mut c.shared_store] {
                s(&mut t.requests);
                s(&mut t.wavefronts);
            }
            for v in [
                &mut c.warp_instructions,
                &mut c.thread_instructions,
                &mut c.barriers,
                &mut c.l2_sectors,
                &mut c.atomics,
                &mut c.tensor_macs,
                &mut c.unique_read_sectors,
                &mut c.unique_write_sectors,
            ] {
                s(v);
            }
        }
        c
    }
}
