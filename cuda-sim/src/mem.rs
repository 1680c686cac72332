//! Global memory as kernels see it: a set of live allocations, each a byte array with
//! an initialisation shadow. The driver implements [`GlobalMemory`] over a device's
//! allocations; [`FlatMemory`] is one allocation, for tests of the interpreter.
//!
//! Bytes are `AtomicU8` accessed with relaxed ordering: blocks of a kernel run on several
//! host threads at once and may touch neighbouring bytes (a GPU allows that), and
//! relaxed byte atomics compile to plain loads and stores on x86-64 and aarch64.

use std::sync::atomic::{AtomicU8, Ordering};

/// Why an address range cannot be accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemError {
    /// No allocation, live or freed, holds the range (or it straddles an allocation's end).
    OutOfBounds,
    /// The range lies in an allocation that was freed.
    Freed,
}

/// One allocation, as handed to the interpreter for direct access.
#[derive(Clone, Copy)]
pub struct Region<'a> {
    /// Device address of `bytes[0]`.
    pub base: u64,
    /// The allocation's bytes.
    pub bytes: &'a [AtomicU8],
    /// One entry per byte, non-zero once the byte was written (by a copy, a memset or a
    /// kernel). `None` when the memory does not track initialisation.
    pub init: Option<&'a [AtomicU8]>,
}

impl Region<'_> {
    /// Whether `[addr, addr + len)` lies in this region.
    #[inline]
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base + self.bytes.len() as u64)
    }

    /// Reads `out.len()` bytes at `addr` (which the caller checked with [`contains`]).
    /// Returns false if initialisation is tracked and some byte was never written.
    ///
    /// [`contains`]: Region::contains
    #[inline]
    pub fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        let at = (addr - self.base) as usize;
        let n = out.len();
        for (o, b) in out.iter_mut().zip(&self.bytes[at..at + n]) {
            *o = b.load(Ordering::Relaxed);
        }
        match self.init {
            Some(init) => init[at..at + n]
                .iter()
                .all(|b| b.load(Ordering::Relaxed) != 0),
            None => true,
        }
    }

    /// Writes `data` at `addr` (checked with [`contains`]) and marks it initialised.
    ///
    /// [`contains`]: Region::contains
    #[inline]
    pub fn write(&self, addr: u64, data: &[u8]) {
        let at = (addr - self.base) as usize;
        for (b, &v) in self.bytes[at..at + data.len()].iter().zip(data) {
            b.store(v, Ordering::Relaxed);
        }
        if let Some(init) = self.init {
            for b in &init[at..at + data.len()] {
                b.store(1, Ordering::Relaxed);
            }
        }
    }
}

/// What a kernel's global loads and stores go through. The interpreter caches the last
/// [`Region`] it got and asks again only for an address outside it, so `region` may
/// be slow-ish (a lock and a map lookup).
pub trait GlobalMemory: Sync {
    /// The allocation holding all of `[addr, addr + len)`.
    fn region(&self, addr: u64, len: u64) -> Result<Region<'_>, MemError>;
}

/// One allocation at a fixed base, for tests and for users who run a kernel without
/// the driver.
pub struct FlatMemory {
    base: u64,
    bytes: Box<[AtomicU8]>,
    init: Option<Box<[AtomicU8]>>,
}

impl FlatMemory {
    /// `size` zero bytes at `base`; `track_init` turns on the initialisation shadow
    /// (every byte starts uninitialised).
    pub fn new(base: u64, size: usize, track_init: bool) -> FlatMemory {
        let zeros = |n: usize| (0..n).map(|_| AtomicU8::new(0)).collect::<Box<[_]>>();
        FlatMemory {
            base,
            bytes: zeros(size),
            init: track_init.then(|| zeros(size)),
        }
    }

    /// Device address of the first byte.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Writes `data` at `addr` from the host (marks it initialised). Panics if the
    /// range is outside the allocation.
    pub fn write(&self, addr: u64, data: &[u8]) {
        let r = self
            .region(addr, data.len() as u64)
            .expect("FlatMemory::write out of range");
        r.write(addr, data);
    }

    /// Reads `out.len()` bytes at `addr` from the host. Panics if the range is outside
    /// the allocation.
    pub fn read(&self, addr: u64, out: &mut [u8]) {
        let r = self
            .region(addr, out.len() as u64)
            .expect("FlatMemory::read out of range");
        let _ = r.read(addr, out);
    }
}

impl GlobalMemory for FlatMemory {
    fn region(&self, addr: u64, len: u64) -> Result<Region<'_>, MemError> {
        let r = Region {
            base: self.base,
            bytes: &self.bytes,
            init: self.init.as_deref(),
        };
        if r.contains(addr, len) {
            Ok(r)
        } else {
            Err(MemError::OutOfBounds)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_memory_bounds_and_init() {
        let m = FlatMemory::new(0x1000, 16, true);
        assert!(m.region(0x1000, 16).is_ok());
        assert_eq!(m.region(0x1008, 9).err(), Some(MemError::OutOfBounds));
        assert_eq!(m.region(0xfff, 1).err(), Some(MemError::OutOfBounds));
        let r = m.region(0x1000, 4).unwrap();
        let mut out = [0u8; 4];
        assert!(!r.read(0x1000, &mut out), "fresh bytes are uninitialised");
        r.write(0x1000, &[1, 2, 3, 4]);
        assert!(r.read(0x1000, &mut out));
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(!r.read(0x1002, &mut out), "bytes 4..6 were never written");
    }
}
