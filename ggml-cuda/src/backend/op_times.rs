//! Per-node op timing: timed events around each node's kernels while it is on.

use ggml_core::BackendResult;

use super::{lock, CudaBackend, State};
use crate::driver::{Api, Event};
use crate::op_timing::OpTimer;

impl CudaBackend {
    /// Times every node computed from now on (`true`), with a pair of timed events
    /// around its kernels, or stops and drops what was measured (`false`). Recording the
    /// events costs host time per node: time other runs than those whose speed you
    /// report. Read the times with [`CudaBackend::take_op_times`].
    pub fn set_op_timing(&self, on: bool) -> BackendResult<()> {
        self.bind()?;
        let api = self.api();
        if on {
            lock(&self.state).timer.get_or_insert_with(OpTimer::default);
            return Ok(());
        }
        api.stream_synchronize(self.stream)
            .map_err(|e| self.cu(e))?;
        if let Some(mut t) = lock(&self.state).timer.take() {
            t.destroy(&api);
        }
        Ok(())
    }

    /// The GPU time per kind of op since timing started or the last call, longest
    /// first (empty while timing is off), and starts new sums. Waits for the stream.
    pub fn take_op_times(&self) -> BackendResult<Vec<ggml_core::OpTime>> {
        self.bind()?;
        let api = self.api();
        api.stream_synchronize(self.stream)
            .map_err(|e| self.cu(e))?;
        let mut st = lock(&self.state);
        Ok(st
            .timer
            .as_mut()
            .map(|t| {
                t.settle(&api);
                t.take()
            })
            .unwrap_or_default())
    }

    /// Runs `step` (a node, or a fused run) between two timed events, counted as `key`.
    pub(crate) fn run_timed(
        &self,
        st: &mut State,
        key: ggml_core::OpKey,
        step: impl FnOnce(&CudaBackend, &mut State) -> BackendResult<()>,
    ) -> BackendResult<()> {
        let api = self.api();
        let timer = st.timer.as_mut().expect("called with timing on");
        let (a, b) = timer.pair(&api, self.dev.ctx).map_err(|e| self.cu(e))?;
        let r = api
            .event_record(a, self.stream)
            .map_err(|e| self.cu(e))
            .and_then(|()| step(self, st))
            .and_then(|()| api.event_record(b, self.stream).map_err(|e| self.cu(e)));
        let timer = st.timer.as_mut().expect("called with timing on");
        match r {
            Ok(()) => timer.push(key, a, b),
            Err(_) => timer.give_back([a, b]),
        }
        r
    }

    /// Waits for `ev` until it completed (`true`) or `timeout` passed (`false`): one
    /// query, then a blocking wait on a helper thread (see `waiter`).
    pub(super) fn wait_timed(
        &self,
        ev: Event,
        timeout: std::time::Duration,
    ) -> BackendResult<bool> {
        self.counters.host_sync();
        if self.api().event_query(ev).map_err(|e| self.cu(e))? {
            return Ok(true);
        }
        if timeout.is_zero() {
            return Ok(false);
        }
        self.counters.call(crate::host_counters::Call::EventSync);
        self.waiter
            .wait(self.dev.api, self.dev.ctx, ev, timeout)
            .map_err(|e| self.cu(e))
    }
}
