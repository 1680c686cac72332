//! The per-worker counting state the interpreter feeds, one instruction at a time,
//! before the instruction executes (its addresses and sources are read as it sees them).

use std::collections::{HashMap, HashSet};

use super::access::{sectors_and_lines, shared_wavefronts};
use super::class::{InstrClass, MemSpace};
use super::l2::{READ, WRITE};
use super::{Latencies, LaunchCounters, PathCounts, ProfileOptions};
use crate::ptx::ir::{Addr, AddrBase, Instr, MmaKind, Op, Operand};

/// When a value is ready, and the path that led to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp {
    pub(crate) t: u64,
    pub(crate) path: PathCounts,
}

/// The issue time a warp's clock jumps to at `griddepcontrol.wait`: far beyond any path,
/// so that what follows the wait is timed from it (its release) and what came before
/// delays nothing after it.
pub(crate) const WAIT_RELEASE: u64 = 1 << 40;

/// What a launch's worker counted.
pub(crate) struct Collector {
    pub(crate) c: LaunchCounters,
    sectors: HashMap<u64, u8>,
    /// The sectors the running block has read (its idealised L1).
    block_reads: HashSet<u64>,
    lat: Latencies,
    /// The latest block end so far.
    crit: Stamp,
    /// The latest arrival at `griddepcontrol.wait` so far.
    pre_wait: Stamp,
    /// The cycles the last `griddepcontrol.wait` took to issue (before the clock jumped
    /// to [`WAIT_RELEASE`]), for the stall lines.
    wait_issue: u64,
    /// Whether to keep the critical warp's cycles by source line.
    stall_lines: bool,
    /// The cycles by source line of the warp that ended `crit`.
    crit_stalls: Vec<(u32, u64)>,
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
        // An mma's result takes tens of cycles (Hopper: about 30), far more than an ALU
        // result: priced at the special-function latency, the nearest kind.
        InstrClass::Special | InstrClass::Emulated | InstrClass::TensorCore => Hop::Special,
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
        Op::Prefetch { addr } => addr_regs(addr, f),
        Op::Half { a, b, c, .. }
        | Op::Prmt { a, b, c, .. }
        | Op::Lop3 { a, b, c, .. }
        | Op::Shf { a, b, c, .. } => {
            for o in [a, b, c] {
                operand_regs(o, f);
            }
        }
        Op::CvtPack { a, b, .. } => {
            operand_regs(a, f);
            operand_regs(b, f);
        }
        Op::Bfi { a, b, pos, len, .. } => {
            for o in [a, b, pos, len] {
                operand_regs(o, f);
            }
        }
        Op::Bits { a, .. } => operand_regs(a, f),
        Op::Atom { addr, a, b, .. } => {
            addr_regs(addr, f);
            operand_regs(a, f);
            operand_regs(b, f);
        }
        Op::Mma(m) => m.a.iter().chain(&m.b).chain(&m.c).for_each(|&r| f(r)),
        Op::Ldmatrix { addr, .. } => addr_regs(addr, f),
        Op::CpAsync {
            dst, src, src_size, ..
        } => {
            addr_regs(dst, f);
            addr_regs(src, f);
            if let Some(o) = src_size {
                operand_regs(o, f);
            }
        }
        Op::BarSync
        | Op::Bra { .. }
        | Op::Call { .. }
        | Op::Ret
        | Op::Exit
        | Op::Trap
        | Op::Fence
        | Op::GridDepWait
        | Op::GridDepLaunch
        | Op::CpAsyncCommit
        | Op::CpAsyncWait { .. } => {}
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
        | Op::Half { d, .. }
        | Op::CvtPack { d, .. }
        | Op::Prmt { d, .. }
        | Op::Lop3 { d, .. }
        | Op::Shf { d, .. }
        | Op::Bfi { d, .. }
        | Op::Bits { d, .. } => f(*d),
        Op::Atom { d, .. } => d.iter().for_each(|&r| f(r)),
        Op::Mma(m) => m.d.iter().for_each(|&r| f(r)),
        Op::Ldmatrix { d, .. } => d.iter().for_each(|&r| f(r)),
        Op::Fence
        | Op::GridDepWait
        | Op::GridDepLaunch
        | Op::Prefetch { .. }
        | Op::CpAsync { .. }
        | Op::CpAsyncCommit
        | Op::CpAsyncWait { .. }
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
    pub(crate) fn new(opts: &ProfileOptions) -> Collector {
        Collector {
            c: LaunchCounters::default(),
            sectors: HashMap::new(),
            block_reads: HashSet::new(),
            lat: opts.latencies,
            crit: Stamp::default(),
            pre_wait: Stamp::default(),
            wait_issue: 0,
            stall_lines: opts.stall_lines,
            crit_stalls: Vec::new(),
            addrs: Vec::with_capacity(32),
            lanes: Vec::with_capacity(32),
            scratch: Vec::with_capacity(64),
        }
    }

    /// Counts instruction `ins`, executed by the lanes of `exec` of a warp whose
    /// registers are `regs` (32 lanes each) and ready stamps `ready`; advances the
    /// warp's issue clock, and `async_ready`, when its `cp.async` copies land.
    pub(crate) fn instruction(
        &mut self,
        ins: &Instr,
        regs: &[u64],
        ready: &mut [Stamp],
        exec: u32,
        clock: &mut Stamp,
        async_ready: &mut Stamp,
    ) {
        let class = InstrClass::of(&ins.op);
        self.c.warp_instructions += 1;
        self.c.thread_instructions += exec.count_ones() as u64;
        self.c.classes.add(class);
        self.schedule(ins, class, ready, clock, async_ready, exec);
        if exec == 0 {
            return;
        }
        match (&ins.op, class) {
            (Op::Mma(m), _) => {
                let macs = m.m as u64 * m.n as u64 * m.k as u64;
                self.c.tensor_macs += macs;
                if matches!(m.kind, MmaKind::Int8 { .. }) {
                    self.c.tensor_macs_int8 += macs;
                }
            }
            (Op::Ldmatrix { d, addr, .. }, _) => {
                // Lanes 8i..8i+7 address the rows of matrix i: 16 bytes each, one phase
                // (eight lanes of 16 bytes) per matrix.
                self.lanes.clear();
                for lane in 0..8 * d.len() {
                    self.lanes.push((lane as u32, lane_addr(regs, addr, lane)));
                }
                self.c.shared_load.requests += 1;
                self.c.shared_load.wavefronts += shared_wavefronts(&self.lanes, 16);
            }
            (
                Op::CpAsync {
                    size,
                    dst,
                    src,
                    src_size,
                },
                _,
            ) => {
                let reads = match src_size {
                    None => exec,
                    Some(Operand::Imm(0)) => 0,
                    Some(Operand::Reg(r)) => {
                        let mut m = 0;
                        for lane in 0..32 {
                            m |=
                                ((regs[*r as usize * 32 + lane] & 0xffff_ffff != 0) as u32) << lane;
                        }
                        exec & m
                    }
                    Some(_) => exec,
                };
                if reads != 0 {
                    self.global(regs, src, reads, *size as u64, false);
                }
                self.shared(regs, dst, exec, *size as u64, true);
            }
            (Op::Atom { addr, .. }, InstrClass::Atomic { space }) => {
                self.c.atomics += 1;
                if space == MemSpace::Global {
                    self.atomic_sectors(regs, addr, exec, &ins.op);
                }
            }
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

    fn schedule(
        &mut self,
        ins: &Instr,
        class: InstrClass,
        ready: &mut [Stamp],
        clock: &mut Stamp,
        async_ready: &mut Stamp,
        exec: u32,
    ) {
        let mut issue = *clock;
        issue.t += 1;
        issue.path.issue += 1;
        // A wait for cp.async groups waits for the copies issued before it (all of
        // them: which group a copy belongs to is not tracked here).
        if matches!(ins.op, Op::CpAsyncWait { .. }) && exec != 0 && *async_ready > issue {
            issue = *async_ready;
        }
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
        if matches!(ins.op, Op::GridDepWait) && exec != 0 && issue.t < WAIT_RELEASE {
            self.pre_wait = self.pre_wait.max(issue);
            self.wait_issue = issue.t - clock.t;
            issue = Stamp {
                t: WAIT_RELEASE,
                path: Default::default(),
            };
        }
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
        if matches!(ins.op, Op::CpAsync { .. }) && exec != 0 && done > *async_ready {
            *async_ready = done;
        }
    }

    /// The sectors a global atomic request touches: read and written in L2 (atomics
    /// are resolved there, not in L1).
    fn atomic_sectors(&mut self, regs: &[u64], addr: &Addr, exec: u32, op: &Op) {
        let width = match op {
            Op::Atom { ty, .. } => ty.bytes() as u64,
            _ => return,
        };
        self.addrs.clear();
        for lane in 0..32 {
            if exec >> lane & 1 != 0 {
                self.addrs.push(lane_addr(regs, addr, lane));
            }
        }
        sectors_and_lines(&self.addrs, width, &mut self.scratch);
        for &s in &self.scratch {
            *self.sectors.entry(s).or_insert(0) |= READ | WRITE;
            self.c.l2_sectors += 1;
        }
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

    /// The cycles the last `griddepcontrol.wait` took to issue before the warp's clock
    /// jumped to [`WAIT_RELEASE`] (what its source line is charged).
    pub(crate) fn wait_issue(&self) -> u64 {
        self.wait_issue
    }

    /// Whether warps should keep their cycles by source line for [`Self::end_block`].
    pub(crate) fn stall_lines(&self) -> bool {
        self.stall_lines
    }

    /// A block ended; `end` is the latest last-issue stamp of its warps, and `stalls`
    /// that warp's cycles by source line (empty unless [`Self::stall_lines`]).
    pub(crate) fn end_block(&mut self, end: Stamp, stalls: &HashMap<u32, u64>) {
        self.c.blocks_interpreted += 1;
        self.block_reads.clear();
        if end > self.crit {
            self.crit = end;
            if self.stall_lines {
                self.crit_stalls = stalls.iter().map(|(&l, &c)| (l, c)).collect();
                self.crit_stalls.sort_unstable();
            }
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
        a.tensor_macs_int8 += b.tensor_macs_int8;
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
            self.crit_stalls = o.crit_stalls;
        }
        self.pre_wait = self.pre_wait.max(o.pre_wait);
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
        if self.crit.t >= WAIT_RELEASE {
            let (pre, post) = (self.pre_wait.path, self.crit.path);
            c.critical_path = PathCounts {
                issue: pre.issue + post.issue,
                alu: pre.alu + post.alu,
                special: pre.special + post.special,
                shared: pre.shared + post.shared,
                global: pre.global + post.global,
            };
            c.critical_path_cycles = self.pre_wait.t + (self.crit.t - WAIT_RELEASE);
            c.post_wait_path = Some(post);
        } else {
            c.critical_path = self.crit.path;
            c.critical_path_cycles = self.crit.t;
        }
        c.critical_stalls = self.crit_stalls;
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
                &mut c.tensor_macs_int8,
                &mut c.unique_read_sectors,
                &mut c.unique_write_sectors,
            ] {
                s(v);
            }
        }
        c
    }
}
