//! Kernel error words: the slot a launch writes when an index is out of range, and the
//! check after each synchronisation that turns a word set into the error of its op and node.

use ggml_core::{BackendError, BackendErrorKind, BackendResult, Name};

use super::{lock, CudaBackend, State};
use crate::driver::Api;
use crate::err_words::{first_set, Users, REGION_WORDS};

impl CudaBackend {
    /// The error word for a launch of `op` (node `node`) that checks its indices (see
    /// `err_words`: past [`REGION_WORDS`] launches in one region the last word is shared).
    pub(crate) fn err_slot(&self, st: &mut State, op: &'static str, node: Name) -> u64 {
        self.err_word + 4 * st.err.slot(op, node) as u64
    }

    /// The pinned mirror of error-word region `region`'s first `n` words, as they are now
    /// (a copy may be writing them: each word is read once, whole).
    fn mirror(&self, region: usize, n: usize) -> Vec<u32> {
        (0..n.min(REGION_WORDS))
            .map(|i| {
                // SAFETY: within the ERR_WORDS pinned words; a volatile read of an
                // aligned u32 that a DMA may be writing.
                unsafe { self.err_host.add(region * REGION_WORDS + i).read_volatile() }
            })
            .collect()
    }

    /// The error of the first word set in `region` among `users`, if any.
    pub(crate) fn region_error(&self, region: usize, users: &Users) -> Option<BackendError> {
        let (op, node, shared) = first_set(&self.mirror(region, users.len()), users)?;
        let detail = if shared {
            // Shared by every launch from the last word on: any of them may have set it.
            "a row index or expert id was outside its range (this op or a later index-checking op)"
        } else if op == "MUL_MAT_ID" {
            "an expert id was outside 0..n_as"
        } else {
            "a row index was outside the rows"
        };
        Some(BackendError::new(BackendErrorKind::BadData, self.name, detail).at(op, node))
    }

    /// Clears region 0's error words and forgets their users without reading them (the
    /// stream idle after), for launches whose inputs were not a real pass's (replays).
    pub(crate) fn discard_kernel_errors(&self) -> BackendResult<()> {
        lock(&self.state).err.eager.clear();
        let api = self.api();
        api.memset_d8_async(self.err_word, 0, 4 * REGION_WORDS, self.stream)
            .and_then(|()| api.stream_synchronize(self.stream))
            .map_err(|e| self.cu(e))?;
        // SAFETY: region 0's words of the pinned mirror; the stream is idle.
        unsafe { std::ptr::write_bytes(self.err_host, 0, REGION_WORDS) };
        Ok(())
    }

    /// Enqueues the copy of region 0's words handed out since the last check to their
    /// mirror (before the synchronisation that makes it readable).
    pub(super) fn mirror_eager_words(&self, st: &State) -> BackendResult<()> {
        let n = st.err.eager.len().min(REGION_WORDS);
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the first n words of the pinned mirror; nothing reads them before the
        // synchronisation that follows.
        unsafe {
            self.api().memcpy_dtoh_pinned_async(
                self.err_host as *mut u8,
                self.err_word,
                4 * n,
                self.stream,
            )
        }
        .map_err(|e| self.cu(e))
    }

    /// Reads the error words of the interval that a stream synchronisation just ended
    /// (region 0's mirrored before it, the graphs' by their own copies) and starts a new
    /// interval: every region with a word set is cleared, and the first word set names
    /// the error's op and node.
    pub(super) fn check_kernel_errors(&self, st: &mut State) -> BackendResult<()> {
        let mut regions: Vec<(usize, Users)> = Vec::new();
        if !st.err.eager.is_empty() {
            regions.push((0, std::mem::take(&mut st.err.eager)));
        }
        for c in st.graphs.captured_mut() {
            if std::mem::take(&mut c.armed) {
                regions.push((c.region, c.users.clone()));
            }
        }
        regions.extend(st.err.retired.iter().cloned());
        st.err.release_retired();
        let mut first = None;
        for (region, users) in regions {
            let Some(e) = self.region_error(region, &users) else {
                continue;
            };
            first.get_or_insert(e);
            // On our stream, so the next kernel that may set a word runs after it.
            let n = users.len().min(REGION_WORDS);
            let at = self.err_word + (4 * region * REGION_WORDS) as u64;
            self.api()
                .memset_d8_async(at, 0, 4 * n, self.stream)
                .map_err(|e| self.cu(e))?;
            // SAFETY: region's words of the pinned mirror; the stream is idle.
            unsafe { std::ptr::write_bytes(self.err_host.add(region * REGION_WORDS), 0, n) };
        }
        first.map_or(Ok(()), Err)
    }
}
