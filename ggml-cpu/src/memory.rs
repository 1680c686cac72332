//! Host memory regions behind buffer handles, and their registries.
//!
//! A [`Region`] is a range of host memory: either allocated here (64-byte aligned,
//! zeroed) or wrapped (memory-mapped files and other caller memory). Registries map
//! [`BufferId`]s to regions; queued work clones the `Arc` of every region it touches, so a
//! buffer freed while work is still queued stays alive until that work is done.

use std::alloc::Layout;
use std::sync::{Arc, Mutex, MutexGuard};

use ggml_core::{BufferId, DataRef, MemoryDomain};

/// Alignment of buffers allocated by the CPU backend, in bytes.
pub const ALIGNMENT: usize = 64;

enum Owner {
    /// Allocated with this layout by `Region::alloc`.
    Alloc(Layout),
    /// Keeps foreign memory (e.g. a memory map) alive; read-only.
    Shared(#[allow(dead_code)] Arc<dyn AsRef<[u8]> + Send + Sync>),
    /// Caller-guaranteed memory (see `CpuBackend::host_buffer_raw` and
    /// `Backend::buffer_from_host_ptr`).
    Raw,
}

/// A range of host memory.
pub(crate) struct Region {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    owner: Owner,
}

// SAFETY: a Region is a plain address range; all access goes through raw pointers whose
// ordering is the queue's and the caller's responsibility (backend contract).
unsafe impl Send for Region {}
// SAFETY: as above; the Region itself is immutable after construction.
unsafe impl Sync for Region {}

impl Region {
    /// Allocates `len` zeroed bytes aligned to [`ALIGNMENT`].
    pub(crate) fn alloc(len: usize) -> Option<Region> {
        let layout = Layout::from_size_align(len.max(1), ALIGNMENT).ok()?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return None;
        }
        Some(Region {
            ptr,
            len,
            writable: true,
            owner: Owner::Alloc(layout),
        })
    }

    /// Wraps shared, read-only memory.
    pub(crate) fn shared(mem: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Region {
        let s: &[u8] = (*mem).as_ref();
        let (ptr, len) = (s.as_ptr() as *mut u8, s.len());
        Region {
            ptr,
            len,
            writable: false,
            owner: Owner::Shared(mem),
        }
    }

    /// Wraps caller memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads and writes until the region is dropped.
    pub(crate) unsafe fn raw(ptr: *mut u8, len: usize) -> Region {
        Region {
            ptr,
            len,
            writable: true,
            owner: Owner::Raw,
        }
    }

    /// Wraps caller memory read-only.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads, and unchanged, until the region is dropped.
    pub(crate) unsafe fn borrowed(ptr: *const u8, len: usize) -> Region {
        Region {
            ptr: ptr as *mut u8,
            len,
            writable: false,
            owner: Owner::Raw,
        }
    }

    pub(crate) fn base(&self) -> u64 {
        self.ptr as u64
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// Pointer to byte `addr - base` if `addr..addr+len` lies inside the region.
    pub(crate) fn ptr_at(&self, addr: u64, len: usize) -> Option<*mut u8> {
        let off = addr.checked_sub(self.base())?;
        let off = usize::try_from(off).ok()?;
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: off + len <= self.len, so the result stays inside the allocation.
        Some(unsafe { self.ptr.add(off) })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Owner::Alloc(layout) = self.owner {
            // SAFETY: allocated in `Region::alloc` with exactly this layout.
            unsafe { std::alloc::dealloc(self.ptr, layout) }
        }
    }
}

/// Buffers of one memory domain, indexed by `BufferId::index` (indices are never reused).
pub(crate) struct Registry {
    domain: MemoryDomain,
    slots: Mutex<Vec<Option<Arc<Region>>>>,
}

impl Registry {
    pub(crate) const fn new(domain: MemoryDomain) -> Registry {
        Registry {
            domain,
            slots: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn domain(&self) -> MemoryDomain {
        self.domain
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<Option<Arc<Region>>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn insert(&self, region: Region) -> (BufferId, Arc<Region>) {
        let region = Arc::new(region);
        let mut slots = self.lock();
        let index = slots.len() as u32;
        slots.push(Some(region.clone()));
        (
            BufferId {
                domain: self.domain,
                index,
            },
            region,
        )
    }

    pub(crate) fn remove(&self, id: BufferId) -> Option<Arc<Region>> {
        if id.domain != self.domain {
            return None;
        }
        self.lock()
            .get_mut(id.index as usize)
            .and_then(|s| s.take())
    }

    pub(crate) fn get(&self, id: BufferId) -> Option<Arc<Region>> {
        if id.domain != self.domain {
            return None;
        }
        self.lock().get(id.index as usize).and_then(|s| s.clone())
    }
}

/// Buffers in [`MemoryDomain::HOST`] (wrapped caller memory), shared by every CPU backend.
pub(crate) static HOST: Registry = Registry::new(MemoryDomain::HOST);

/// Looks up the region holding `data .. data + len` in `own` or in the host registry.
pub(crate) fn resolve(
    own: &Registry,
    data: DataRef,
    len: usize,
) -> Result<(Arc<Region>, *mut u8), &'static str> {
    let region = if data.buffer.domain == own.domain() {
        own.get(data.buffer)
    } else if data.buffer.domain == MemoryDomain::HOST {
        HOST.get(data.buffer)
    } else {
        return Err("tensor is in a memory domain this backend cannot access");
    }
    .ok_or("tensor's buffer was freed or never existed")?;
    let ptr = region
        .ptr_at(data.addr, len)
        .ok_or("tensor bytes lie outside its buffer")?;
    Ok((region, ptr))
}
