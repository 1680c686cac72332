//! Memory the backend manages for itself: pinned staging chunks for host copies, device
//! scratch for Q8_1 activations, decode attention's partials and counters.

use ggml_core::{BackendErrorKind, BackendResult};

use super::{cu_err, CudaBackend, Staging, State, STAGING_LIMIT, STAGING_MIN};
use crate::driver::Api;

impl CudaBackend {
    /// A pinned staging chunk of at least `len` (at most [`STAGING_CHUNK_MAX`](super::STAGING_CHUNK_MAX)) bytes that
    /// no queued copy uses, keeping the backend's pinned memory within [`STAGING_LIMIT`]:
    /// a free chunk that fits, else a new one while there is room, else idle chunks too
    /// small for `len` make room, else the oldest busy chunk is waited for.
    pub(crate) fn staging(&self, st: &mut State, len: usize) -> BackendResult<usize> {
        let api = self.api();
        let want = len.max(STAGING_MIN).next_power_of_two();
        loop {
            for s in st.staging.iter_mut().filter(|s| s.busy) {
                if api.event_query(s.event).map_err(|e| self.cu(e))? {
                    s.busy = false;
                }
            }
            let fit = (0..st.staging.len())
                .filter(|&i| !st.staging[i].busy && st.staging[i].size >= len)
                .min_by_key(|&i| st.staging[i].size);
            if let Some(i) = fit {
                return Ok(i);
            }
            let total: usize = st.staging.iter().map(|s| s.size).sum();
            if total + want <= STAGING_LIMIT {
                return self.new_staging(st, want);
            }
            if let Some(i) = st.staging.iter().position(|s| !s.busy) {
                // Idle but too small for this copy: give its room to a larger chunk.
                let s = st.staging.swap_remove(i);
                api.event_destroy(s.event);
                api.mem_free_host(self.dev.ctx, s.ptr)
                    .map_err(|e| self.cu(e))?;
                continue;
            }
            let Some(oldest) = (0..st.staging.len()).min_by_key(|&i| st.staging[i].last_use) else {
                return self.new_staging(st, want);
            };
            let s = &mut st.staging[oldest];
            api.event_synchronize(s.event).map_err(|e| self.cu(e))?;
            s.busy = false;
        }
    }

    fn new_staging(&self, st: &mut State, size: usize) -> BackendResult<usize> {
        let api = self.api();
        let p = api
            .mem_alloc_host(self.dev.ctx, size)
            .map_err(|e| cu_err(self.name, BackendErrorKind::OutOfMemory, e))?;
        let ev = match api.event_create(self.dev.ctx) {
            Ok(ev) => ev,
            Err(e) => {
                let _ = api.mem_free_host(self.dev.ctx, p);
                return Err(self.cu(e));
            }
        };
        st.staging.push(Staging {
            ptr: p,
            size,
            event: ev,
            busy: false,
            last_use: 0,
        });
        Ok(st.staging.len() - 1)
    }

    /// Device scratch of at least `len` bytes for this graph (Q8_1 activations). A
    /// smaller old scratch may still be in use by queued kernels, so it is freed at the
    /// next `synchronize`; the CUDA graphs that use it go with it.
    ///
    /// `graph_compute` sizes the scratch for all of a split's nodes before it launches
    /// or captures any ([`crate::ops::scratch_need`]): growing it inside a capture would
    /// allocate there, which is an error, so a node that needs more than `scratch_need`
    /// says fails its capture.
    pub(crate) fn scratch(&self, st: &mut State, len: usize) -> BackendResult<u64> {
        if st.scratch_size >= len {
            return Ok(st.scratch);
        }
        if st.capturing {
            return Err(self.err(
                BackendErrorKind::Device,
                "scratch would grow while a CUDA graph is captured (ops::scratch_need is short)",
            ));
        }
        self.clear_graphs(st);
        let size = len.next_power_of_two().max(1 << 20);
        let p = self
            .api()
            .mem_alloc(self.dev.ctx, size)
            .map_err(|e| cu_err(self.name, BackendErrorKind::OutOfMemory, e))?;
        if st.scratch != 0 {
            let old = st.scratch;
            st.retired.push(old);
        }
        st.scratch = p;
        st.scratch_size = size;
        Ok(p)
    }

    /// Decode attention's partials (at least `part_bytes`) and zeroed counters (at least
    /// `counters`), as (partials, counters). Outgrown allocations may still be in use by
    /// queued kernels, so they are freed at the next `synchronize`; new counters are
    /// zeroed on the stream, before any kernel that uses them.
    pub(crate) fn attn_workspace(
        &self,
        st: &mut State,
        part_bytes: usize,
        counters: usize,
    ) -> BackendResult<(u64, u64)> {
        let api = self.dev.api;
        let oom = |e| cu_err(self.name, BackendErrorKind::OutOfMemory, e);
        let grows = st.attn_part.1 < part_bytes || st.attn_ctr.1 < counters;
        if grows && st.capturing {
            return Err(self.err(
                BackendErrorKind::Device,
                "tiled attention's workspace would grow while a CUDA graph is captured",
            ));
        }
        if grows {
            // Graphs hold the old workspace's addresses, which are freed at the next
            // synchronisation.
            self.clear_graphs(st);
        }
        if st.attn_part.1 < part_bytes {
            let size = part_bytes.next_power_of_two().max(1 << 16);
            let p = api.mem_alloc(self.dev.ctx, size).map_err(oom)?;
            if st.attn_part.0 != 0 {
                st.retired.push(st.attn_part.0);
            }
            st.attn_part = (p, size);
        }
        if st.attn_ctr.1 < counters {
            let n = counters.next_power_of_two().max(256);
            let p = api.mem_alloc(self.dev.ctx, 4 * n).map_err(oom)?;
            api.memset_d8_async(p, 0, 4 * n, self.stream)
                .map_err(|e| self.cu(e))?;
            if st.attn_ctr.0 != 0 {
                st.retired.push(st.attn_ctr.0);
            }
            st.attn_ctr = (p, n);
        }
        Ok((st.attn_part.0, st.attn_ctr.0))
    }
}
