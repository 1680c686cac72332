//! Memory access of one block: loads and stores with the alignment and bounds checks,
//! the shared and local windows, and the shared-memory race detector's shadow bytes.

use super::*;

impl<'a> BlockRunner<'a> {
    #[allow(clippy::type_complexity)]
    pub(super) fn load(
        &mut self,
        space: Space,
        at: u64,
        out: &mut [u8],
        fr: &Frame,
        warp: u32,
        lane: usize,
    ) -> Result<(), (FaultKind, usize, Option<u64>, String)> {
        let n = out.len();
        match space {
            Space::Global => {
                self.check_align(at, n, lane)?;
                let r = self.region(at, n, lane)?;
                if !r.read(at, out) && self.l.checks.initcheck {
                    return Err((
                        FaultKind::UninitializedRead,
                        lane,
                        Some(at),
                        format!("{n}-byte load of device memory never written"),
                    ));
                }
            }
            Space::Shared => {
                self.check_align(at, n, lane)?;
                let s = self.shared_range(at, n, lane)?;
                self.race(s, n, warp, Access::Read, lane, at)?;
                out.copy_from_slice(&self.shared[s..s + n]);
            }
            Space::Local => {
                self.check_align(at, n, lane)?;
                let s = self.local_range(at, n, warp, lane)?;
                out.copy_from_slice(&self.local[s..s + n]);
            }
            Space::KernelParam => {
                let s = at as usize;
                let src = self.l.args.get(s..s + n).ok_or_else(|| {
                    (
                        FaultKind::LocalOrSharedOutOfBounds,
                        lane,
                        Some(at),
                        "kernel parameter read out of range".to_string(),
                    )
                })?;
                out.copy_from_slice(src);
            }
            Space::FuncParam => {
                let s = at as usize;
                if s + n > fr.param_bytes {
                    return Err((
                        FaultKind::LocalOrSharedOutOfBounds,
                        lane,
                        Some(at),
                        "parameter read out of range".into(),
                    ));
                }
                let b = lane * fr.param_bytes + s;
                out.copy_from_slice(&fr.params[b..b + n]);
            }
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn store(
        &mut self,
        space: Space,
        at: u64,
        data: &[u8],
        fr: &mut Frame,
        warp: u32,
        lane: usize,
    ) -> Result<(), (FaultKind, usize, Option<u64>, String)> {
        let n = data.len();
        match space {
            Space::Global => {
                self.check_align(at, n, lane)?;
                let r = self.region(at, n, lane)?;
                r.write(at, data);
            }
            Space::Shared => {
                self.check_align(at, n, lane)?;
                let s = self.shared_range(at, n, lane)?;
                self.race(s, n, warp, Access::Write, lane, at)?;
                self.shared[s..s + n].copy_from_slice(data);
            }
            Space::Local => {
                self.check_align(at, n, lane)?;
                let s = self.local_range(at, n, warp, lane)?;
                self.local[s..s + n].copy_from_slice(data);
            }
            Space::KernelParam => {
                return Err((
                    FaultKind::IllegalInstruction,
                    lane,
                    Some(at),
                    "store to a kernel parameter".into(),
                ));
            }
            Space::FuncParam => {
                let s = at as usize;
                if s + n > fr.param_bytes {
                    return Err((
                        FaultKind::LocalOrSharedOutOfBounds,
                        lane,
                        Some(at),
                        "parameter write out of range".into(),
                    ));
                }
                let b = lane * fr.param_bytes + s;
                fr.params[b..b + n].copy_from_slice(data);
            }
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn check_align(
        &self,
        at: u64,
        n: usize,
        lane: usize,
    ) -> Result<(), (FaultKind, usize, Option<u64>, String)> {
        if self.l.checks.memcheck && at % n as u64 != 0 {
            return Err((
                FaultKind::Misaligned,
                lane,
                Some(at),
                format!("{n}-byte access not {n}-byte aligned"),
            ));
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn region(
        &mut self,
        at: u64,
        n: usize,
        lane: usize,
    ) -> Result<Region<'a>, (FaultKind, usize, Option<u64>, String)> {
        if let Some(r) = self.region {
            if r.contains(at, n as u64) {
                return Ok(r);
            }
        }
        match self.l.mem.region(at, n as u64) {
            Ok(r) => {
                self.region = Some(r);
                Ok(r)
            }
            Err(MemError::Freed) => Err((
                FaultKind::UseAfterFree,
                lane,
                Some(at),
                format!("{n}-byte access of freed device memory"),
            )),
            Err(MemError::OutOfBounds) => Err((
                FaultKind::OutOfBounds,
                lane,
                Some(at),
                format!("{n}-byte access outside every live allocation"),
            )),
        }
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn shared_range(
        &self,
        at: u64,
        n: usize,
        lane: usize,
    ) -> Result<usize, (FaultKind, usize, Option<u64>, String)> {
        if at
            .checked_add(n as u64)
            .is_none_or(|e| e > self.shared.len() as u64)
        {
            return Err((
                FaultKind::LocalOrSharedOutOfBounds,
                lane,
                Some(at),
                format!("shared access past the block's {} bytes", self.shared.len()),
            ));
        }
        Ok(at as usize)
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn local_range(
        &self,
        at: u64,
        n: usize,
        warp: u32,
        lane: usize,
    ) -> Result<usize, (FaultKind, usize, Option<u64>, String)> {
        if at
            .checked_add(n as u64)
            .is_none_or(|e| e > self.local_bytes as u64)
        {
            return Err((
                FaultKind::LocalOrSharedOutOfBounds,
                lane,
                Some(at),
                format!("local access past the thread's {} bytes", self.local_bytes),
            ));
        }
        let t = warp as usize * 32 + lane;
        Ok(t * self.local_bytes + at as usize)
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn race(
        &mut self,
        s: usize,
        n: usize,
        warp: u32,
        access: Access,
        lane: usize,
        at: u64,
    ) -> Result<(), (FaultKind, usize, Option<u64>, String)> {
        if !self.l.checks.racecheck {
            return Ok(());
        }
        if let Some(p) = self.pending[s..s + n].iter().find(|&&p| p != 0) {
            let what = match access {
                Access::Read => "reads",
                Access::Write => "writes",
                Access::Atomic => "updates",
            };
            return Err((
                FaultKind::SharedRace,
                lane,
                Some(at),
                format!(
                    "warp {warp} {what} shared bytes that a cp.async of warp {} is still copying (no cp.async.wait_group of the issuing thread covers it yet)",
                    p - 1
                ),
            ));
        }
        let w = warp as u16;
        let epoch = self.epoch;
        let other = |x: u16| x != NONE && x != w;
        for b in &mut self.shadow[s..s + n] {
            if b.epoch != epoch {
                *b = ShadowByte {
                    epoch,
                    writer: NONE,
                    reader: NONE,
                    atomic: NONE,
                };
            }
            let conflict = if other(b.writer) {
                Some(("written", b.writer))
            } else if access != Access::Read && other(b.reader) {
                Some(("read", b.reader))
            } else if access != Access::Atomic && other(b.atomic) {
                Some(("updated atomically", b.atomic))
            } else {
                None
            };
            if let Some((how, o)) = conflict {
                let who = if o == MANY {
                    "other warps".to_string()
                } else {
                    format!("warp {o}")
                };
                let what = match access {
                    Access::Read => "reads",
                    Access::Write => "writes",
                    Access::Atomic => "atomically updates",
                };
                return Err((
                    FaultKind::SharedRace,
                    lane,
                    Some(at),
                    format!(
                        "warp {warp} {what} shared bytes {how} by {who} with no bar.sync between"
                    ),
                ));
            }
            let slot = match access {
                Access::Write => {
                    b.writer = w;
                    continue;
                }
                Access::Read => &mut b.reader,
                Access::Atomic => &mut b.atomic,
            };
            if *slot == NONE {
                *slot = w;
            } else if *slot != w {
                *slot = MANY;
            }
        }
        Ok(())
    }
}
