//! Results that come back with one host wait ([`Backend::buffer_prefetch`]): the copy
//! into pinned memory is enqueued right behind the work that produced the bytes, so the
//! host's wait for the scheduler's event covers it, and the later `buffer_get` is a
//! `memcpy` from pinned memory with no driver call. Without it a read is a copy enqueued
//! at read time plus a second wait (and, behind a pipeline, that copy would queue behind
//! the next pass).
//!
//! [`Backend::buffer_prefetch`]: ggml_core::Backend::buffer_prefetch

use ggml_core::{Backend, BackendErrorKind, BackendResult, BufferId};

use crate::backend::{cu_err, CudaBackend, State};
use crate::driver::Api;

/// Largest prefetched read (bytes): a token's logits and more; larger reads (a prompt's
/// logits for perplexity) take the ordinary path.
pub(crate) const PREFETCH_MAX: usize = 4 << 20;

/// Most prefetches outstanding at once (one per pipeline slot in flight, with room).
const MAX_SLOTS: usize = 8;

/// One pinned area and the range copied into it.
pub(crate) struct Prefetch {
    ptr: *mut u8,
    cap: usize,
    /// The range copied, while it waits to be read.
    pending: Option<Pending>,
}

#[derive(Clone, Copy)]
struct Pending {
    buffer: BufferId,
    offset: usize,
    len: usize,
    /// The stream's sequence number after the copy: complete once `seq_completed`
    /// reaches it.
    seq: u64,
}

/// The backend's prefetch areas.
#[derive(Default)]
pub(crate) struct Readbacks {
    slots: Vec<Prefetch>,
}

impl Readbacks {
    /// Pinned areas to free when the backend goes.
    pub(crate) fn drain_ptrs(&mut self) -> impl Iterator<Item = *mut u8> + '_ {
        self.slots.drain(..).map(|s| s.ptr)
    }

    /// Drops the pending reads of `buffer` (freed: its id may come back).
    pub(crate) fn forget(&mut self, buffer: BufferId) {
        for s in &mut self.slots {
            if s.pending.is_some_and(|p| p.buffer == buffer) {
                s.pending = None;
            }
        }
    }
}

impl CudaBackend {
    /// [`ggml_core::Backend::buffer_prefetch`]: copies `len` bytes at `src` (of
    /// `buffer` at `offset`) into a pinned area on the stream.
    pub(crate) fn prefetch(
        &self,
        st: &mut State,
        buffer: BufferId,
        offset: usize,
        src: u64,
        len: usize,
    ) -> BackendResult<bool> {
        if len == 0 || len > PREFETCH_MAX || st.capturing {
            return Ok(false);
        }
        // A new copy of the same range replaces an unread one.
        st.readback.forget_range(buffer, offset, len);
        let api = self.api();
        let i = match st
            .readback
            .slots
            .iter()
            .position(|s| s.pending.is_none() && s.cap >= len)
        {
            Some(i) => i,
            None if st.readback.slots.len() < MAX_SLOTS => {
                let cap = len.next_power_of_two().max(4096);
                let ptr = api
                    .mem_alloc_host(self.dev.ctx, cap)
                    .map_err(|e| cu_err(self.name(), BackendErrorKind::OutOfMemory, e))?;
                st.readback.slots.push(Prefetch {
                    ptr,
                    cap,
                    pending: None,
                });
                st.readback.slots.len() - 1
            }
            None => return Ok(false),
        };
        self.flush_uploads(st, false)?;
        let p = st.readback.slots[i].ptr;
        // SAFETY: the area holds at least `len` bytes and no other copy targets it (it has
        // no pending read); the host reads it only after the stream passed this copy.
        unsafe { api.memcpy_dtoh_pinned_async(p, src, len, self.stream) }
            .map_err(|e| self.cu(e))?;
        st.seq_enqueued += 1;
        st.readback.slots[i].pending = Some(Pending {
            buffer,
            offset,
            len,
            seq: st.seq_enqueued,
        });
        Ok(true)
    }

    /// Serves a `buffer_get` of exactly a prefetched range whose copy the stream is known
    /// to have passed (the host waited for a later event): `true` when `out` was filled.
    /// A prefetched range not yet known complete is dropped: the caller reads it the
    /// ordinary way (which waits).
    pub(crate) fn take_prefetched(
        &self,
        st: &mut State,
        buffer: BufferId,
        offset: usize,
        out: &mut [u8],
    ) -> bool {
        let done = st.seq_completed;
        let Some(s) = st.readback.slots.iter_mut().find(|s| {
            s.pending
                .is_some_and(|p| p.buffer == buffer && p.offset == offset && p.len == out.len())
        }) else {
            return false;
        };
        let p = s.pending.take().expect("matched a pending read");
        if p.seq > done {
            return false;
        }
        // SAFETY: the stream passed the copy into the area, which holds `out.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(s.ptr, out.as_mut_ptr(), out.len()) };
        true
    }
}

impl Readbacks {
    /// Drops unread copies that overlap `offset..offset + len` of `buffer`.
    fn forget_range(&mut self, buffer: BufferId, offset: usize, len: usize) {
        for s in &mut self.slots {
            if s.pending.is_some_and(|p| {
                p.buffer == buffer && p.offset < offset + len && offset < p.offset + p.len
            }) {
                s.pending = None;
            }
        }
    }
}
