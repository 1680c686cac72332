//! Executing one block: warps of 32 lanes over the decoded code, with min-PC
//! scheduling for divergence, call frames, barriers and the checks.

mod collective;
mod instr;
mod memory;

use std::collections::HashMap;

use super::arith;
use super::{bits, half};
use crate::fault::{Checks, FaultKind, KernelFault};
use crate::mem::{GlobalMemory, MemError, Region};
use crate::profile::collect::{Collector, Stamp, WAIT_RELEASE};
use crate::profile::{InstrClass, MemSpace};
use crate::ptx::ir::{Addr, AddrBase, BinOp, Instr, Op, Operand, ShflMode, Space, Special, Ty};
use crate::ptx::Module;

/// Deepest call nesting before a call faults.
const MAX_CALL_DEPTH: usize = 64;

/// What a launch shares with every block.
pub(crate) struct Launch<'a> {
    pub module: &'a Module,
    pub entry: usize,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub args: &'a [u8],
    pub mem: &'a dyn GlobalMemory,
    pub checks: Checks,
    pub shared_bytes: usize,
    pub profile: Option<crate::profile::ProfileOptions>,
    /// Launched with programmatic stream serialisation: global accesses before
    /// `griddepcontrol.wait` are faults (racecheck).
    pub programmatic: bool,
    /// Serialises global atomics: blocks run on several host threads, and memory is
    /// bytes, so a read-modify-write of a word takes this lock.
    pub atomic_lock: std::sync::Mutex<()>,
}

struct Frame {
    func: usize,
    /// Lanes executing this call.
    mask: u32,
    /// Lanes that returned.
    done: u32,
    pc: [u32; 32],
    regs: Vec<u64>,
    params: Vec<u8>,
    param_bytes: usize,
    /// Where the callee's return goes in the caller's params.
    ret_to: Option<(u32, u32)>,
    /// When each register's value is ready (profiling only; empty otherwise).
    ready: Vec<Stamp>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum WarpState {
    Running,
    AtBarrier,
    Exited,
}

struct Warp {
    id: u32,
    /// Lanes that exist (a partial last warp has fewer).
    lanes: u32,
    exited: u32,
    frames: Vec<Frame>,
    state: WarpState,
    /// The issue clock of the profiler's scoreboard.
    clock: Stamp,
    /// When the warp's outstanding `cp.async` copies have landed (profiler only).
    async_ready: Stamp,
    /// Issue-clock cycles by source line (profiler, with `stall_lines` only).
    stalls: HashMap<u32, u64>,
    /// Lanes that have run `griddepcontrol.wait`.
    waited: u32,
}

/// Shadow of one shared byte for racecheck: epoch, last writer warp, reader warp,
/// warp that used it atomically (`u16::MAX` none, `u16::MAX - 1` several).
#[derive(Clone, Copy, Default)]
struct ShadowByte {
    epoch: u32,
    writer: u16,
    reader: u16,
    atomic: u16,
}

/// How a warp touches shared bytes, for racecheck.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    /// An atomic: races with plain accesses of other warps, not with their atomics.
    Atomic,
}

/// One `cp.async` in flight: the bytes read at issue, to land in shared memory when a
/// `cp.async.wait_group` / `wait_all` of the issuing thread covers its group.
#[derive(Clone, Copy)]
struct AsyncCopy {
    dst: usize,
    len: u8,
    data: [u8; 16],
}

/// A thread's `cp.async` state: copies issued since its last commit, and its committed
/// groups, oldest first.
#[derive(Default)]
struct ThreadAsync {
    open: Vec<AsyncCopy>,
    groups: std::collections::VecDeque<Vec<AsyncCopy>>,
}

const NONE: u16 = u16::MAX;
const MANY: u16 = u16::MAX - 1;

/// Reusable per-worker state: one block at a time.
pub(crate) struct BlockRunner<'a> {
    l: &'a Launch<'a>,
    ctaid: [u32; 3],
    shared: Vec<u8>,
    shadow: Vec<ShadowByte>,
    /// Per shared byte (racecheck only): 0, or 1 + the warp whose `cp.async` into it
    /// has not been waited for.
    pending: Vec<u16>,
    /// Per thread of the block: its `cp.async` copies.
    asyncs: Vec<ThreadAsync>,
    epoch: u32,
    local: Vec<u8>,
    local_bytes: usize,
    pool: Vec<Frame>,
    /// The block's warps, kept between blocks so their frame stacks keep their memory.
    warps: Vec<Warp>,
    region: Option<Region<'a>>,
    pub warp_instructions: u64,
    pub thread_instructions: u64,
    /// The counters, when the launch is profiled.
    pub prof: Option<Box<Collector>>,
}

/// Whether `op` reads or writes global memory (generic addresses included).
fn touches_global(op: &Op) -> bool {
    match InstrClass::of(op) {
        InstrClass::Load { space, .. } | InstrClass::Store { space, .. } => {
            matches!(space, MemSpace::Global)
        }
        InstrClass::Atomic { space } => matches!(space, MemSpace::Global),
        _ => false,
    }
}

/// Advances the program counter of the lanes in `group` (branch-free, vectorised).
#[inline(always)]
fn step(pc: &mut [u32; 32], group: u32) {
    for (lane, p) in pc.iter_mut().enumerate() {
        *p += group >> lane & 1;
    }
}

/// The 32 lanes of register `r` of `fr`.
#[inline(always)]
fn dst(fr: &mut Frame, r: u16) -> &mut [u64] {
    let b = r as usize * 32;
    &mut fr.regs[b..b + 32]
}

fn lanes_of(mask: u32) -> impl Iterator<Item = usize> {
    let mut m = mask;
    std::iter::from_fn(move || {
        if m == 0 {
            None
        } else {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(l)
        }
    })
}

/// The lowest program counter among the `live` lanes, and the lanes at it. Branch-free
/// over all 32 lanes, so the compiler vectorises it: it runs once per instruction.
#[inline]
fn min_pc(pc: &[u32; 32], live: u32) -> (u32, u32) {
    let keyed: [u32; 32] = std::array::from_fn(|lane| {
        if live >> lane & 1 != 0 {
            pc[lane]
        } else {
            u32::MAX
        }
    });
    let min = keyed.iter().copied().fold(u32::MAX, u32::min);
    let mut group = 0u32;
    for (lane, &k) in keyed.iter().enumerate() {
        group |= ((k == min) as u32) << lane;
    }
    (min, group & live)
}

impl<'a> BlockRunner<'a> {
    pub(crate) fn new(l: &'a Launch<'a>) -> BlockRunner<'a> {
        let threads = (l.block[0] * l.block[1] * l.block[2]) as usize;
        let local_bytes = l.module.local_bytes;
        BlockRunner {
            l,
            ctaid: [0; 3],
            shared: vec![0; l.shared_bytes],
            shadow: if l.checks.racecheck {
                vec![ShadowByte::default(); l.shared_bytes]
            } else {
                Vec::new()
            },
            pending: if l.checks.racecheck {
                vec![0; l.shared_bytes]
            } else {
                Vec::new()
            },
            asyncs: (0..threads).map(|_| ThreadAsync::default()).collect(),
            epoch: 0,
            local: vec![0; local_bytes * threads],
            local_bytes,
            pool: Vec::new(),
            warps: Vec::new(),
            region: None,
            warp_instructions: 0,
            thread_instructions: 0,
            prof: l.profile.map(|p| Box::new(Collector::new(&p))),
        }
    }

    fn new_frame(&mut self, func: usize, mask: u32, ret_to: Option<(u32, u32)>) -> Frame {
        let f = &self.l.module.functions[func];
        let mut fr = self.pool.pop().unwrap_or_else(|| Frame {
            func,
            mask: 0,
            done: 0,
            pc: [0; 32],
            regs: Vec::new(),
            params: Vec::new(),
            param_bytes: 0,
            ret_to: None,
            ready: Vec::new(),
        });
        fr.func = func;
        fr.mask = mask;
        fr.done = 0;
        fr.pc = [0; 32];
        fr.regs.clear();
        fr.regs.resize(f.n_regs * 32, 0);
        fr.params.clear();
        fr.params.resize(f.param_bytes * 32, 0);
        fr.param_bytes = f.param_bytes;
        fr.ret_to = ret_to;
        fr.ready.clear();
        if self.prof.is_some() {
            fr.ready.resize(f.n_regs, Stamp::default());
        }
        fr
    }

    /// Runs block `ctaid` to completion.
    pub(crate) fn run(&mut self, ctaid: [u32; 3]) -> Result<(), Box<KernelFault>> {
        self.ctaid = ctaid;
        self.shared.fill(0);
        self.pending.fill(0);
        for a in &mut self.asyncs {
            a.open.clear();
            a.groups.clear();
        }
        self.epoch = self.epoch.wrapping_add(1);
        self.local.fill(0);
        let threads = self.l.block[0] * self.l.block[1] * self.l.block[2];
        let n_warps = threads.div_ceil(32);
        let mut warps = std::mem::take(&mut self.warps);
        warps.truncate(n_warps as usize);
        while warps.len() < n_warps as usize {
            warps.push(Warp {
                id: 0,
                lanes: 0,
                exited: 0,
                frames: Vec::new(),
                state: WarpState::Running,
                clock: Stamp::default(),
                async_ready: Stamp::default(),
                stalls: HashMap::new(),
                waited: 0,
            });
        }
        for (w, warp) in warps.iter_mut().enumerate() {
            let w = w as u32;
            let n = (threads - w * 32).min(32);
            warp.id = w;
            warp.lanes = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
            warp.exited = 0;
            warp.state = WarpState::Running;
            warp.clock = Stamp::default();
            warp.async_ready = Stamp::default();
            warp.stalls.clear();
            warp.waited = 0;
            let fr = self.new_frame(self.l.entry, warp.lanes, None);
            warp.frames.push(fr);
        }
        let result = loop {
            let mut failed = None;
            for w in warps.iter_mut() {
                if w.state == WarpState::Running {
                    let r = if self.prof.is_some() {
                        self.run_warp::<true>(w)
                    } else {
                        self.run_warp::<false>(w)
                    };
                    if let Err(e) = r {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                break Err(e);
            }
            if warps.iter().all(|w| w.state == WarpState::Exited) {
                if let Some(p) = self.prof.as_deref_mut() {
                    let last = warps.iter().max_by_key(|w| w.clock);
                    let empty = HashMap::new();
                    p.end_block(
                        last.map(|w| w.clock).unwrap_or_default(),
                        last.map_or(&empty, |w| &w.stalls),
                    );
                }
                break Ok(());
            }
            // Every live warp waits at the barrier: release them into a new epoch.
            self.epoch = self.epoch.wrapping_add(1);
            if self.prof.is_some() {
                let latest = warps
                    .iter()
                    .filter(|w| w.state == WarpState::AtBarrier)
                    .max_by_key(|w| w.clock);
                let at = latest.map(|w| w.clock).unwrap_or_default();
                // The path through a barrier comes from the latest arrival, so every warp
                // it releases takes that warp's cycles by line (the stall report then
                // follows the critical path instead of charging the wait to `bar.sync`).
                let path_stalls = match latest {
                    Some(w) if self.prof.as_deref().is_some_and(Collector::stall_lines) => {
                        Some(w.stalls.clone())
                    }
                    _ => None,
                };
                for w in warps.iter_mut().filter(|w| w.state == WarpState::AtBarrier) {
                    if let Some(s) = &path_stalls {
                        w.stalls.clone_from(s);
                    }
                    w.clock = at;
                }
            }
            for w in warps.iter_mut() {
                if w.state == WarpState::AtBarrier {
                    w.state = WarpState::Running;
                }
            }
        };
        for w in warps.iter_mut() {
            self.pool.append(&mut w.frames);
        }
        self.warps = warps;
        result
    }

    fn tid_of(&self, warp: u32, lane: usize) -> [u32; 3] {
        let t = warp * 32 + lane as u32;
        let [bx, by, _] = self.l.block;
        [t % bx, (t / bx) % by, t / (bx * by)]
    }

    fn fault(
        &self,
        kind: FaultKind,
        ins: &Instr,
        w: &Warp,
        lane: usize,
        address: Option<u64>,
        detail: String,
    ) -> Box<KernelFault> {
        let m = self.l.module;
        Box::new(KernelFault {
            kind,
            kernel: m.functions[self.l.entry].name.clone(),
            file: m.file.clone(),
            line: ins.line,
            instruction: m.line_text(ins.line).to_string(),
            block: self.ctaid,
            thread: self.tid_of(w.id, lane),
            address,
            detail,
        })
    }

    #[inline]
    fn special(&self, s: Special, warp: u32, lane: usize) -> u64 {
        let tid = self.tid_of(warp, lane);
        (match s {
            Special::Tid(a) => tid[a as usize],
            Special::Ntid(a) => self.l.block[a as usize],
            Special::Ctaid(a) => self.ctaid[a as usize],
            Special::Nctaid(a) => self.l.grid[a as usize],
            Special::Laneid => lane as u32,
            Special::Warpid => warp,
        }) as u64
    }

    /// Operand `o` for all 32 lanes: one copy of a register's lanes, not a match per lane.
    #[inline(always)]
    fn vals(&self, fr: &Frame, o: &Operand, warp: u32) -> [u64; 32] {
        match o {
            Operand::Reg(r) => {
                let b = *r as usize * 32;
                fr.regs[b..b + 32]
                    .try_into()
                    .expect("a register has 32 lanes")
            }
            Operand::Imm(v) => [*v; 32],
            _ => std::array::from_fn(|lane| self.get(fr, o, warp, lane)),
        }
    }

    #[inline]
    fn get(&self, fr: &Frame, o: &Operand, warp: u32, lane: usize) -> u64 {
        match o {
            Operand::Reg(r) => fr.regs[*r as usize * 32 + lane],
            Operand::Imm(v) => *v,
            Operand::Special(s) => self.special(*s, warp, lane),
            Operand::SymAddr(_, off) => *off,
            Operand::Vector(_) => 0,
        }
    }

    /// Runs warp `w` until it exits or waits at a barrier. `PROFILE` is whether the
    /// profiler counts (a separate instance, so that an unprofiled launch runs the
    /// interpreter loop without any profiling code in it).
    fn run_warp<const PROFILE: bool>(&mut self, w: &mut Warp) -> Result<(), Box<KernelFault>> {
        let module = self.l.module;
        loop {
            let depth = w.frames.len();
            let top = w
                .frames
                .last_mut()
                .expect("a warp has a frame while running");
            let live = top.mask & !top.done & !w.exited;
            if live == 0 {
                if depth == 1 {
                    w.state = WarpState::Exited;
                    return Ok(());
                }
                let callee = w.frames.pop().expect("depth > 1");
                let caller = w.frames.last_mut().expect("depth > 1");
                let cf = &module.functions[callee.func];
                for lane in lanes_of(callee.mask) {
                    if let (Some((roff, rsize)), Some((coff, _))) = (callee.ret_to, cf.ret_slot) {
                        let (roff, rsize, coff) = (roff as usize, rsize as usize, coff as usize);
                        let src = lane * callee.param_bytes + coff;
                        let dst = lane * caller.param_bytes + roff;
                        caller.params[dst..dst + rsize]
                            .copy_from_slice(&callee.params[src..src + rsize]);
                    }
                    caller.pc[lane] += 1;
                }
                self.pool.push(callee);
                continue;
            }
            let (minpc, group) = min_pc(&top.pc, live);
            let func = &module.functions[top.func];
            let Some(ins) = func.code.get(minpc as usize) else {
                // Falling off the end returns.
                top.done |= group;
                continue;
            };
            let exec = match ins.guard {
                Some((p, neg)) => {
                    let mut m = 0;
                    let b = p as usize * 32;
                    for (lane, &v) in top.regs[b..b + 32].iter().enumerate() {
                        m |= (((v != 0) != neg) as u32) << lane;
                    }
                    m &= group;
                    m
                }
                None => group,
            };
            self.warp_instructions += 1;
            self.thread_instructions += exec.count_ones() as u64;
            if PROFILE {
                if let Some(p) = self.prof.as_deref_mut() {
                    let before = w.clock.t;
                    p.instruction(
                        ins,
                        &top.regs,
                        &mut top.ready,
                        exec,
                        &mut w.clock,
                        &mut w.async_ready,
                    );
                    if p.stall_lines() {
                        // Past a `griddepcontrol.wait` the clock counts from its release.
                        let after = w.clock.t;
                        let spent = if before < WAIT_RELEASE && after >= WAIT_RELEASE {
                            p.wait_issue() + (after - WAIT_RELEASE)
                        } else {
                            after - before
                        };
                        *w.stalls.entry(ins.line).or_default() += spent;
                    }
                }
            }
            match &ins.op {
                Op::Bra { target } => {
                    for lane in lanes_of(group) {
                        top.pc[lane] = if exec & (1 << lane) != 0 {
                            *target
                        } else {
                            minpc + 1
                        };
                    }
                }
                Op::Call {
                    func: callee,
                    ret,
                    args,
                } => {
                    step(&mut top.pc, group & !exec);
                    if exec == 0 {
                        continue;
                    }
                    if depth >= MAX_CALL_DEPTH {
                        let lane = exec.trailing_zeros() as usize;
                        return Err(self.fault(
                            FaultKind::IllegalInstruction,
                            ins,
                            w,
                            lane,
                            None,
                            "call depth limit (recursion?)".into(),
                        ));
                    }
                    let callee = *callee as usize;
                    let mut fr = self.new_frame(callee, exec, *ret);
                    let top = w.frames.last().expect("caller");
                    let cf = &module.functions[callee];
                    for lane in lanes_of(exec) {
                        for (&(aoff, asize), &(poff, _)) in args.iter().zip(&cf.param_slots) {
                            let (aoff, asize, poff) =
                                (aoff as usize, asize as usize, poff as usize);
                            let src = lane * top.param_bytes + aoff;
                            let dst = lane * fr.param_bytes + poff;
                            fr.params[dst..dst + asize]
                                .copy_from_slice(&top.params[src..src + asize]);
                        }
                    }
                    w.frames.push(fr);
                }
                Op::Ret => {
                    top.done |= exec;
                    step(&mut top.pc, group & !exec);
                }
                Op::Exit => {
                    w.exited |= exec;
                    step(&mut top.pc, group & !exec);
                }
                Op::Trap => {
                    if exec != 0 {
                        let lane = exec.trailing_zeros() as usize;
                        return Err(self.fault(
                            FaultKind::IllegalInstruction,
                            ins,
                            w,
                            lane,
                            None,
                            "trap".into(),
                        ));
                    }
                    step(&mut top.pc, group);
                }
                Op::GridDepWait => {
                    w.waited |= exec;
                    step(&mut top.pc, group);
                }
                Op::GridDepLaunch => step(&mut top.pc, group),
                Op::BarSync => {
                    if exec != 0 {
                        let all = w.lanes & !w.exited;
                        if self.l.checks.synccheck && (exec != all || depth != 1 || exec != group) {
                            let lane = exec.trailing_zeros() as usize;
                            return Err(self.fault(
                                FaultKind::BarrierDivergence,
                                ins,
                                w,
                                lane,
                                None,
                                format!("bar.sync reached by lanes {exec:#010x} of warp {} whose live lanes are {all:#010x}", w.id),
                            ));
                        }
                    }
                    step(&mut top.pc, group);
                    if exec != 0 {
                        w.state = WarpState::AtBarrier;
                        return Ok(());
                    }
                }
                _ => {
                    if self.l.programmatic
                        && self.l.checks.racecheck
                        && exec & !w.waited != 0
                        && touches_global(&ins.op)
                    {
                        let lane = (exec & !w.waited).trailing_zeros() as usize;
                        return Err(self.fault(
                            FaultKind::DependencyRace,
                            ins,
                            w,
                            lane,
                            None,
                            "a global memory access before griddepcontrol.wait in a launch with \
                             programmatic stream serialisation (the grid before it may still \
                             be running)"
                                .into(),
                        ));
                    }
                    let exited = w.exited;
                    let (id, lanes) = (w.id, w.lanes);
                    let top = w.frames.last_mut().expect("frame");
                    if let Err((kind, lane, addr, detail)) =
                        self.exec(ins, top, exec, group, id, lanes & !exited)
                    {
                        return Err(self.fault(kind, ins, w, lane, addr, detail));
                    }
                    let top = w.frames.last_mut().expect("frame");
                    step(&mut top.pc, group);
                }
            }
        }
    }

    fn addr_of(&self, fr: &Frame, a: &Addr, warp: u32, lane: usize) -> u64 {
        let base = match a.base {
            AddrBase::Reg(r) => fr.regs[r as usize * 32 + lane],
            AddrBase::Sym(off) => off,
        };
        let _ = warp;
        base.wrapping_add(a.offset as u64)
    }
}
