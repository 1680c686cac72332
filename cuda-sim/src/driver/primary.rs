//! Primary contexts: retained and released by their users
//! (`cuDevicePrimaryCtxRetain` / `cuDevicePrimaryCtxRelease`), and reset when the last
//! user releases one or on request (`cuDevicePrimaryCtxReset`). A reset destroys the
//! context's streams, events, modules and memory and clears its sticky error, which is
//! how a program recovers a device after a fault.
//!
//! Every driver call names its device, so the context of each device exists from the
//! start; retaining only counts users. Pinned host memory is not tied to a context in
//! cuda-sim: it stays until freed, so a leak of it stays visible.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::stream::{StreamKind, StreamShared};
use super::{lock, write, Driver};
use crate::error::{CuError, ErrorCode};

impl Driver {
    /// Counts a user of device `dev`'s primary context.
    pub fn primary_ctx_retain(&self, dev: usize) -> Result<(), CuError> {
        self.device(dev)?;
        *lock(&self.shared.contexts[dev].retained) += 1;
        Ok(())
    }

    /// Ends a use of device `dev`'s primary context; the last one resets it (see
    /// [`primary_ctx_reset`](Driver::primary_ctx_reset)). Releasing a context nobody
    /// retained is `CUDA_ERROR_INVALID_CONTEXT`.
    pub fn primary_ctx_release(&self, dev: usize) -> Result<(), CuError> {
        self.device(dev)?;
        let mut n = lock(&self.shared.contexts[dev].retained);
        if *n == 0 {
            return Err(CuError::new(
                ErrorCode::InvalidContext,
                format!(
                    "cuDevicePrimaryCtxRelease: device {dev}'s primary context is not retained"
                ),
            ));
        }
        *n -= 1;
        if *n == 0 {
            self.reset_context(dev);
        }
        Ok(())
    }

    /// Destroys everything of device `dev`'s context: waits for its streams (work on a
    /// poisoned context is skipped), destroys them (the legacy stream stays), its events
    /// and modules, frees its memory (counted in
    /// [`reclaimed_bytes`](Driver::reclaimed_bytes)), drops its peer access and armed
    /// injections, and clears its sticky error. The caller makes sure nobody uses the
    /// device meanwhile, as with the real call; users that retained it stay counted.
    pub fn primary_ctx_reset(&self, dev: usize) -> Result<(), CuError> {
        self.device(dev)?;
        self.reset_context(dev);
        Ok(())
    }

    /// Bytes of device memory that resets of device `dev`'s context freed because they
    /// were still allocated: memory its users did not free themselves.
    pub fn reclaimed_bytes(&self, dev: usize) -> Result<u64, CuError> {
        self.device(dev)?;
        Ok(self.shared.contexts[dev].reclaimed.load(Ordering::Relaxed))
    }

    fn reset_context(&self, dev: usize) {
        let ctx = &self.shared.contexts[dev];
        let streams: Vec<Arc<StreamShared>> = {
            let mut all = write(&self.streams);
            let ids: Vec<u64> = all
                .iter()
                .filter(|(_, st)| st.dev == dev && st.kind != StreamKind::Legacy)
                .map(|(&id, _)| id)
                .collect();
            ids.iter().filter_map(|id| all.remove(id)).collect()
        };
        lock(&ctx.blocking).clear();
        for st in &streams {
            st.request_shutdown();
        }
        for st in &streams {
            st.join();
        }
        for d in self.sync_targets(&ctx.legacy) {
            d.wait();
        }
        write(&self.events).retain(|_, e| e.dev != dev);
        write(&self.functions).retain(|_, f| f.module.dev != dev);
        write(&self.modules).retain(|_, m| m.dev != dev);
        let bytes = self.shared.memories[dev].reclaim_all();
        ctx.reclaimed.fetch_add(bytes, Ordering::Relaxed);
        self.cancel_injected(dev);
        ctx.clear();
    }
}
