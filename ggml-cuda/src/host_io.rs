//! Host transfers of a [`CudaBackend`] that stay off the driver's pageable paths:
//! batched small uploads (see [`crate::uploads`]) and reads through pinned memory. Also
//! the backend's record of how far the stream is known to have run, which says when a
//! pinned upload area may be written again.

use ggml_core::{Backend, BackendErrorKind, BackendResult};

use crate::backend::{cu_err, CudaBackend, State};
use crate::driver::Api;
use crate::uploads::{Area, Scatter, AREA, AREAS};

impl CudaBackend {
    /// Adds a small upload of `data` to device address `dst` to the batch (flushing the
    /// batch first when it has no room or overlaps it).
    pub(crate) fn upload_small(&self, st: &mut State, dst: u64, data: &[u8]) -> BackendResult<()> {
        if !st.uploads.pieces.is_empty() && !st.uploads.fits(dst, data.len()) {
            self.flush_uploads(st, false)?;
        }
        if st.uploads.pieces.is_empty() {
            self.open_batch(st)?;
        }
        st.uploads.add(dst, data);
        Ok(())
    }

    /// Chooses a pinned area the stream no longer reads for a new batch (allocating the
    /// ring at first use; waiting for the stream if every area is still being read).
    fn open_batch(&self, st: &mut State) -> BackendResult<()> {
        let api = self.api();
        if st.uploads.areas.is_empty() {
            for _ in 0..AREAS {
                let ptr = api
                    .mem_alloc_host(self.dev.ctx, AREA)
                    .map_err(|e| cu_err(self.name(), BackendErrorKind::OutOfMemory, e))?;
                st.uploads.areas.push(Area { ptr, seq: 0 });
            }
        }
        let area = match st.uploads.free_area(st.seq_completed) {
            Some(a) => a,
            None => {
                // Every area's copy may still be pending: a pipeline more than AREAS
                // passes ahead of the host.
                api.stream_synchronize(self.stream)
                    .map_err(|e| self.cu(e))?;
                self.stream_drained(st);
                st.uploads
                    .free_area(st.seq_completed)
                    .expect("every area is free after a synchronisation")
            }
        };
        st.uploads.current = area;
        Ok(())
    }

    /// Enqueues the pending uploads: one piece as one copy; several as one copy of the
    /// batch to the device buffer and a scatter, which is launched here unless `fold`
    /// (then it is returned for the caller to launch first thing, or to capture).
    pub(crate) fn flush_uploads(
        &self,
        st: &mut State,
        fold: bool,
    ) -> BackendResult<Option<Scatter>> {
        if st.uploads.pieces.is_empty() {
            return Ok(None);
        }
        let api = self.api();
        let area = st.uploads.areas[st.uploads.current].ptr;
        let scatter = if let [p] = st.uploads.pieces[..] {
            // SAFETY: the piece lies in the area, which stays untouched until the stream
            // passed this copy (`Uploads::free_area`).
            unsafe { api.memcpy_htod_async(p.dst, area.add(p.off), p.len, self.stream) }
                .map_err(|e| self.cu(e))?;
            None
        } else {
            if st.uploads.dev == 0 {
                st.uploads.dev = api
                    .mem_alloc(self.dev.ctx, AREA)
                    .map_err(|e| cu_err(self.name(), BackendErrorKind::OutOfMemory, e))?;
            }
            let bytes = st.uploads.write_table();
            // SAFETY: as above; `bytes` <= AREA, the size of both buffers.
            unsafe { api.memcpy_htod_async(st.uploads.dev, area, bytes, self.stream) }
                .map_err(|e| self.cu(e))?;
            Some(st.uploads.scatter())
        };
        st.seq_enqueued += 1;
        st.uploads.sent(st.seq_enqueued);
        match (scatter, fold) {
            (Some(s), false) => self.launch_scatter(st, s).map(|()| None),
            (s, _) => Ok(s),
        }
    }

    /// Flushes the pending uploads (before an operation on the stream that must follow
    /// them).
    pub(crate) fn flush_now(&self) -> BackendResult<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.flush_uploads(&mut st, false).map(|_| ())
    }

    /// Notes that the stream ran everything enqueued so far.
    pub(crate) fn stream_drained(&self, st: &mut State) {
        st.seq_completed = st.seq_enqueued;
        for s in &mut st.staging {
            s.busy = false;
        }
    }

    /// Notes that the stream passed the record of the scheduler's event `id`.
    pub(crate) fn event_passed(&self, st: &mut State, id: u32) {
        if let Some(&seq) = st.event_seq.get(&id) {
            st.seq_completed = st.seq_completed.max(seq);
        }
    }

    /// Reads `out.len()` bytes at device address `src` through pinned staging: one copy
    /// per chunk on the stream (after everything enqueued before), a wait, a host copy.
    pub(crate) fn read_pinned(
        &self,
        st: &mut State,
        src: u64,
        out: &mut [u8],
    ) -> BackendResult<()> {
        let api = self.api();
        for (k, piece) in out
            .chunks_mut(crate::backend::STAGING_CHUNK_MAX)
            .enumerate()
        {
            let i = self.staging(st, piece.len())?;
            let p = st.staging[i].ptr;
            let at = src + (k * crate::backend::STAGING_CHUNK_MAX) as u64;
            // SAFETY: the chunk holds at least piece.len() bytes, no queued copy uses it,
            // and it is read only after the synchronisation below.
            unsafe { api.memcpy_dtoh_pinned_async(p, at, piece.len(), self.stream) }
                .map_err(|e| self.cu(e))?;
            api.stream_synchronize(self.stream)
                .map_err(|e| self.cu(e))?;
            self.stream_drained(st);
            // SAFETY: the copy completed; the chunk holds piece.len() bytes.
            unsafe { std::ptr::copy_nonoverlapping(p, piece.as_mut_ptr(), piece.len()) };
        }
        Ok(())
    }
}
