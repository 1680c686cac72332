//! Device memory: each device owns a 1 TiB window of addresses, handed out by a bump
//! allocator (256-byte aligned, a 256-byte red zone after each allocation) and never
//! reused, so a freed range stays recognisable: it is kept as a tombstone and accesses
//! to it report [`MemError::Freed`].
//!
//! Allocations are zero-filled and backed lazily by the host (pages are touched only
//! when written). The live set is a copy-on-write map: a kernel launch takes a snapshot
//! (an `Arc`), so it never holds a lock while it runs, and memory freed during a launch
//! stays valid for that launch.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex, RwLock};

use super::{lock, read, write};
use crate::error::{CuError, ErrorCode};
use crate::mem::{GlobalMemory, MemError, Region};

/// Device address of device 0's first allocation.
pub const ADDRESS_BASE: u64 = 0x7000_0000_0000;
/// log2 of each device's address window: device `d` allocates from
/// `ADDRESS_BASE + (d << WINDOW_SHIFT)`.
pub const WINDOW_SHIFT: u32 = 40;
/// Alignment of allocation bases.
pub const ALLOC_ALIGN: u64 = 256;
/// Unallocated bytes after each allocation (at least), so that small overruns fault.
pub const RED_ZONE: u64 = 256;

/// The device whose window holds `addr`, if any (not checked against the device count).
pub fn device_of(addr: u64) -> Option<usize> {
    let off = addr.checked_sub(ADDRESS_BASE)?;
    usize::try_from(off >> WINDOW_SHIFT).ok()
}

/// Zero-filled atomic bytes, backed lazily (`alloc_zeroed`); `None` if the host has no
/// memory for them.
fn zeroed_bytes(n: usize) -> Option<Box<[AtomicU8]>> {
    if n == 0 {
        return Some(Box::new([]));
    }
    let layout = Layout::array::<AtomicU8>(n).ok()?;
    // SAFETY: `layout` has a non-zero size (n > 0).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<AtomicU8>();
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is a fresh allocation of `n` AtomicU8 with the layout a `Box<[AtomicU8]>`
    // of length n uses, and all-zero bytes are a valid AtomicU8 (it has u8's layout).
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) })
}

/// One device allocation: its bytes and their initialisation shadow.
pub(crate) struct Allocation {
    base: u64,
    bytes: Box<[AtomicU8]>,
    init: Option<Box<[AtomicU8]>>,
}

impl Allocation {
    fn new(base: u64, size: usize, track_init: bool) -> Option<Allocation> {
        Some(Allocation {
            base,
            bytes: zeroed_bytes(size)?,
            init: if track_init {
                Some(zeroed_bytes(size)?)
            } else {
                None
            },
        })
    }

    /// The allocation as the interpreter and the copy engine see it.
    pub(crate) fn region(&self) -> Region<'_> {
        Region {
            base: self.base,
            bytes: &self.bytes,
            init: self.init.as_deref(),
        }
    }

    /// Sets `len` bytes at `addr` (inside this allocation) to `value`, marking them
    /// initialised.
    pub(crate) fn fill(&self, addr: u64, value: u8, len: usize) {
        let at = (addr - self.base) as usize;
        for b in &self.bytes[at..at + len] {
            b.store(value, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(init) = &self.init {
            for b in &init[at..at + len] {
                b.store(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// Live allocations by base address.
pub(crate) type LiveMap = BTreeMap<u64, Arc<Allocation>>;

struct Bump {
    next: u64,
    used: u64,
}

/// One device's memory.
pub(crate) struct DeviceMemory {
    ordinal: usize,
    capacity: u64,
    track_init: bool,
    live: RwLock<Arc<LiveMap>>,
    /// Freed ranges: base -> end.
    freed: RwLock<BTreeMap<u64, u64>>,
    bump: Mutex<Bump>,
}

impl DeviceMemory {
    pub(crate) fn new(ordinal: usize, capacity: u64, track_init: bool) -> DeviceMemory {
        DeviceMemory {
            ordinal,
            capacity,
            track_init,
            live: RwLock::new(Arc::new(BTreeMap::new())),
            freed: RwLock::new(BTreeMap::new()),
            bump: Mutex::new(Bump {
                next: ADDRESS_BASE + ((ordinal as u64) << WINDOW_SHIFT),
                used: 0,
            }),
        }
    }

    fn window_end(&self) -> u64 {
        ADDRESS_BASE + ((self.ordinal as u64 + 1) << WINDOW_SHIFT)
    }

    /// Bytes of live allocations.
    pub(crate) fn used(&self) -> u64 {
        lock(&self.bump).used
    }

    /// A fresh zeroed allocation of `size` bytes.
    pub(crate) fn alloc(&self, size: usize) -> Result<u64, CuError> {
        if size == 0 {
            return Err(CuError::new(
                ErrorCode::InvalidValue,
                "cuMemAlloc of 0 bytes",
            ));
        }
        let oom = |why: String| CuError::new(ErrorCode::OutOfMemory, why);
        let mut bump = lock(&self.bump);
        let size64 = size as u64;
        if bump
            .used
            .checked_add(size64)
            .is_none_or(|u| u > self.capacity)
        {
            return Err(oom(format!(
                "cuMemAlloc of {size} bytes on device {}: {} of {} bytes in use",
                self.ordinal, bump.used, self.capacity
            )));
        }
        let span = size64
            .checked_next_multiple_of(ALLOC_ALIGN)
            .and_then(|s| s.checked_add(RED_ZONE))
            .filter(|&s| {
                bump.next
                    .checked_add(s)
                    .is_some_and(|e| e <= self.window_end())
            });
        let Some(span) = span else {
            return Err(oom(format!(
                "device {}: its address window is exhausted (addresses are never reused)",
                self.ordinal
            )));
        };
        let base = bump.next;
        let a = Allocation::new(base, size, self.track_init).ok_or_else(|| {
            oom(format!(
                "the host could not back a {size}-byte device allocation"
            ))
        })?;
        bump.next += span;
        bump.used += size64;
        Arc::make_mut(&mut *write(&self.live)).insert(base, Arc::new(a));
        Ok(base)
    }

    /// Frees the allocation at `base`, leaving a tombstone.
    pub(crate) fn free(&self, base: u64) -> Result<(), CuError> {
        let mut bump = lock(&self.bump);
        let mut live = write(&self.live);
        match Arc::make_mut(&mut *live).remove(&base) {
            Some(a) => {
                let len = a.bytes.len() as u64;
                // Tombstone first, while the live map is still locked: a lookup that
                // misses the allocation then finds the tombstone.
                write(&self.freed).insert(base, base + len);
                drop(live);
                bump.used -= len;
                Ok(())
            }
            None => {
                drop(live);
                let why = if read(&self.freed).contains_key(&base) {
                    "was already freed"
                } else {
                    "is not the base of a live allocation"
                };
                Err(CuError::new(
                    ErrorCode::InvalidValue,
                    format!("cuMemFree: {base:#x} {why}"),
                ))
            }
        }
    }

    /// Frees every live allocation (a context destroyed with memory still allocated),
    /// leaving tombstones; the bytes freed.
    pub(crate) fn reclaim_all(&self) -> u64 {
        let mut bump = lock(&self.bump);
        let mut live = write(&self.live);
        let map = std::mem::take(Arc::make_mut(&mut *live));
        let mut freed = write(&self.freed);
        let mut bytes = 0;
        for (base, a) in map {
            let len = a.bytes.len() as u64;
            freed.insert(base, base + len);
            bytes += len;
        }
        drop(freed);
        drop(live);
        bump.used -= bytes;
        bytes
    }

    /// A snapshot of the live allocations.
    pub(crate) fn snapshot(&self) -> Arc<LiveMap> {
        read(&self.live).clone()
    }

    /// Whether `addr` lies in a freed allocation.
    pub(crate) fn is_freed(&self, addr: u64) -> bool {
        read(&self.freed)
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, &end)| addr < end)
    }

    /// The live allocation holding all of `[addr, addr + len)`.
    pub(crate) fn lookup(&self, addr: u64, len: u64) -> Result<Arc<Allocation>, MemError> {
        let found = find(&read(&self.live), addr, len).cloned();
        found.ok_or_else(|| self.why_not(addr))
    }

    fn why_not(&self, addr: u64) -> MemError {
        if self.is_freed(addr) {
            MemError::Freed
        } else {
            MemError::OutOfBounds
        }
    }
}

/// The allocation of `map` holding all of `[addr, addr + len)`.
fn find(map: &LiveMap, addr: u64, len: u64) -> Option<&Arc<Allocation>> {
    map.range(..=addr)
        .next_back()
        .map(|(_, a)| a)
        .filter(|a| a.region().contains(addr, len))
}

/// The memory a kernel on one device reaches: its own allocations and those of the
/// devices it enabled peer access to, as they were when the launch started.
pub(crate) struct DeviceView<'a> {
    memories: &'a [DeviceMemory],
    /// Per device: the snapshot if this device may access it.
    maps: Vec<Option<Arc<LiveMap>>>,
}

impl<'a> DeviceView<'a> {
    /// The view of device `dev`, which may access the devices `peers[d]` is true for.
    pub(crate) fn new(memories: &'a [DeviceMemory], dev: usize, peers: &[bool]) -> Self {
        let maps = memories
            .iter()
            .enumerate()
            .map(|(d, m)| (d == dev || peers.get(d) == Some(&true)).then(|| m.snapshot()))
            .collect();
        DeviceView { memories, maps }
    }
}

impl GlobalMemory for DeviceView<'_> {
    fn region(&self, addr: u64, len: u64) -> Result<Region<'_>, MemError> {
        let Some(d) = device_of(addr).filter(|&d| d < self.memories.len()) else {
            return Err(MemError::OutOfBounds);
        };
        if let Some(map) = &self.maps[d] {
            if let Some(a) = find(map, addr, len) {
                return Ok(a.region());
            }
        }
        Err(self.memories[d].why_not(addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bump_tombstones_and_views() {
        let m = [
            DeviceMemory::new(0, 4096, true),
            DeviceMemory::new(1, 4096, true),
        ];
        let a = m[0].alloc(100).unwrap();
        let b = m[0].alloc(256).unwrap();
        assert_eq!(a, ADDRESS_BASE);
        assert_eq!(b, a + 512, "256-aligned plus a red zone");
        let c = m[1].alloc(8).unwrap();
        assert_eq!(device_of(c), Some(1));
        assert_eq!(m[0].used(), 356);
        let view = DeviceView::new(&m, 0, &[false, false]);
        assert!(view.region(a, 100).is_ok());
        assert_eq!(view.region(a + 99, 2).err(), Some(MemError::OutOfBounds));
        assert_eq!(
            view.region(c, 4).err(),
            Some(MemError::OutOfBounds),
            "no peer access"
        );
        assert!(DeviceView::new(&m, 0, &[false, true]).region(c, 4).is_ok());
        m[0].free(a).unwrap();
        assert_eq!(m[0].used(), 256);
        assert!(
            view.region(a, 4).is_ok(),
            "a launch's snapshot keeps freed memory"
        );
        let after = DeviceView::new(&m, 0, &[]);
        assert_eq!(after.region(a + 4, 4).err(), Some(MemError::Freed));
        assert_eq!(m[0].free(a).unwrap_err().code, ErrorCode::InvalidValue);
        assert_eq!(m[0].free(b + 8).unwrap_err().code, ErrorCode::InvalidValue);
        assert_eq!(m[0].alloc(4000).unwrap_err().code, ErrorCode::OutOfMemory);
        assert_eq!(m[0].alloc(0).unwrap_err().code, ErrorCode::InvalidValue);
    }
}
