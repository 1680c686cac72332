//! Pinned (page-locked) host memory: blocks from `cuMemAllocHost`, tracked so that the
//! copy functions can tell pinned from pageable host memory (which changes when a copy
//! reads or writes the host bytes, as with the real driver).
//!
//! Copies that touch pinned memory when they execute do so under this heap's read
//! lock after checking that the block is still allocated, so freeing a block while a
//! copy uses it waits for the copy, and a copy of a freed block faults instead of
//! touching freed host memory.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use super::{read, write};
use crate::error::{CuError, ErrorCode};

/// Alignment of pinned blocks (a page, as the driver's).
pub const PINNED_ALIGN: usize = 4096;

/// A host address handed to a stream's worker. Whoever enqueues one promises, through
/// the unsafe copy functions' contracts or the pinned heap's checks, that it is valid
/// when the worker uses it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostPtr(pub(crate) *mut u8);

// SAFETY: a HostPtr is a plain address; it is only dereferenced by the worker under the
// conditions stated above, which do not depend on the thread.
unsafe impl Send for HostPtr {}
// SAFETY: shared (in a graph's nodes) it only gives out the address; dereferencing
// stays with the worker that runs the copy, under the conditions stated above.
unsafe impl Sync for HostPtr {}

/// The live pinned blocks.
pub(crate) struct PinnedHeap {
    /// Address -> size.
    blocks: RwLock<BTreeMap<usize, usize>>,
    bytes: AtomicU64,
}

impl PinnedHeap {
    pub(crate) fn new() -> PinnedHeap {
        PinnedHeap {
            blocks: RwLock::new(BTreeMap::new()),
            bytes: AtomicU64::new(0),
        }
    }

    /// Live pinned bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// A zeroed, page-aligned block of `size` bytes.
    pub(crate) fn alloc(&self, size: usize) -> Result<*mut u8, CuError> {
        if size == 0 {
            return Err(CuError::new(
                ErrorCode::InvalidValue,
                "cuMemAllocHost of 0 bytes",
            ));
        }
        let layout = Layout::from_size_align(size, PINNED_ALIGN).map_err(|_| {
            CuError::new(
                ErrorCode::OutOfMemory,
                format!("cuMemAllocHost of {size} bytes"),
            )
        })?;
        // SAFETY: the layout's size is non-zero.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(CuError::new(
                ErrorCode::OutOfMemory,
                format!("cuMemAllocHost of {size} bytes: the host has no memory left"),
            ));
        }
        write(&self.blocks).insert(p as usize, size);
        self.bytes.fetch_add(size as u64, Ordering::Relaxed);
        Ok(p)
    }

    /// Frees a block from [`alloc`](PinnedHeap::alloc).
    pub(crate) fn free(&self, p: *mut u8) -> Result<(), CuError> {
        let mut blocks = write(&self.blocks);
        let Some(size) = blocks.remove(&(p as usize)) else {
            return Err(CuError::new(
                ErrorCode::InvalidValue,
                format!("cuMemFreeHost: {p:p} is not a live pinned block"),
            ));
        };
        // SAFETY: `p` was allocated by `alloc` with this layout (the size is the one
        // recorded) and is removed from the map, so it is freed once. No copy uses it:
        // those hold the read lock while they touch a block.
        unsafe { dealloc_block(p as usize, size) };
        self.bytes.fetch_sub(size as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `[p, p + len)` lies in one pinned block.
    pub(crate) fn contains(&self, p: *const u8, len: usize) -> bool {
        covered(&read(&self.blocks), p as usize, len)
    }

    /// Runs `f` with the blocks locked against freeing if `[p, p + len)` lies in one
    /// pinned block; `None` (without running `f`) otherwise.
    pub(crate) fn with_block<R>(
        &self,
        p: *const u8,
        len: usize,
        f: impl FnOnce() -> R,
    ) -> Option<R> {
        let blocks = read(&self.blocks);
        covered(&blocks, p as usize, len).then(f)
    }
}

fn covered(blocks: &BTreeMap<usize, usize>, p: usize, len: usize) -> bool {
    blocks
        .range(..=p)
        .next_back()
        .is_some_and(|(&base, &size)| p.checked_add(len).is_some_and(|end| end <= base + size))
}

/// # Safety
/// `addr` must be a block of `size` bytes from `PinnedHeap::alloc`, not yet freed.
unsafe fn dealloc_block(addr: usize, size: usize) {
    if let Ok(layout) = Layout::from_size_align(size, PINNED_ALIGN) {
        // SAFETY: the caller's contract; the layout is the one `alloc` used.
        unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
    }
}

impl Drop for PinnedHeap {
    fn drop(&mut self) {
        let blocks = self.blocks.get_mut().unwrap_or_else(|e| e.into_inner());
        for (&addr, &size) in blocks.iter() {
            // SAFETY: every entry is a live block from `alloc`; the map is dropped next.
            unsafe { dealloc_block(addr, size) };
        }
        blocks.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_tracked() {
        let h = PinnedHeap::new();
        let p = h.alloc(100).unwrap();
        assert_eq!(p as usize % PINNED_ALIGN, 0);
        assert_eq!(h.bytes(), 100);
        assert!(h.contains(p, 100));
        assert!(h.contains(p.wrapping_add(10), 90));
        assert!(!h.contains(p.wrapping_add(10), 91));
        assert_eq!(h.with_block(p, 4, || 7), Some(7));
        assert!(h.alloc(0).is_err());
        h.free(p).unwrap();
        assert!(!h.contains(p, 1));
        assert_eq!(h.free(p).unwrap_err().code, ErrorCode::InvalidValue);
        assert_eq!(h.bytes(), 0);
        let _leaked_until_drop = h.alloc(4096).unwrap();
    }
}
