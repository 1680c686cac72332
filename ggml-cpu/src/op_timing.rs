//! Time per kind of op ([`CpuBackend::set_op_timing`](crate::CpuBackend::set_op_timing)):
//! thread 0 of the pool reads the clock at the barrier that ends each node, so a node's
//! time is the wall time all threads spent on it, its barrier waits included.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use ggml_core::{OpKey, OpTime};

/// Whether timing is on, and the sums so far; shared by a backend and its executor.
#[derive(Default)]
pub(crate) struct OpClock {
    on: AtomicBool,
    totals: Mutex<BTreeMap<OpKey, (u64, f64)>>,
}

impl OpClock {
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Turns timing on or off; off drops the sums.
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
        if !on {
            self.lock().clear();
        }
    }

    /// The sums so far, longest first, and starts new ones.
    pub(crate) fn take(&self) -> Vec<OpTime> {
        let mut v: Vec<OpTime> = std::mem::take(&mut *self.lock())
            .into_iter()
            .map(|(key, (calls, ms))| OpTime::new(key, calls, ms))
            .collect();
        OpTime::sort_longest_first(&mut v);
        v
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<OpKey, (u64, f64)>> {
        self.totals.lock().unwrap_or_else(|e| e.into_inner())
    }
}
