//! GPU time per kind of op: a pair of timed events around every node a backend computes
//! while timing is on ([`CudaBackend::set_op_timing`](crate::CudaBackend::set_op_timing)),
//! read once the stream has passed them.

use std::collections::BTreeMap;

use ggml_core::{OpKey, OpTime};

use crate::driver::{Api, Ctx, CuError, Event};

/// Timed events in flight and the sums so far, for one backend.
///
/// A node's time runs from the moment the stream reaches the event recorded before its
/// kernels to the one recorded after them. Where the GPU waits for the host (short
/// kernels launched one by one, as in generation), that wait counts too: the times then
/// show where the stream spent its time, not only the kernels' own durations.
#[derive(Default)]
pub(crate) struct OpTimer {
    free: Vec<Event>,
    pending: Vec<(OpKey, Event, Event)>,
    totals: BTreeMap<OpKey, (u64, f64)>,
}

impl OpTimer {
    /// Two timed events for the next node.
    pub(crate) fn pair(&mut self, api: &dyn Api, ctx: Ctx) -> Result<(Event, Event), CuError> {
        let mut next = || match self.free.pop() {
            Some(e) => Ok(e),
            None => api.event_create_timed(ctx),
        };
        let a = next()?;
        match next() {
            Ok(b) => Ok((a, b)),
            Err(e) => {
                self.free.push(a);
                Err(e)
            }
        }
    }

    /// Notes a node whose events were both recorded.
    pub(crate) fn push(&mut self, key: OpKey, start: Event, end: Event) {
        self.pending.push((key, start, end));
    }

    /// Gives back events that were not (both) recorded.
    pub(crate) fn give_back(&mut self, events: [Event; 2]) {
        self.free.extend(events);
    }

    /// Adds the nodes whose events the stream has passed to the sums, in order; the rest
    /// stay pending. A pair whose time cannot be read (the stream failed before it) is
    /// left out.
    pub(crate) fn settle(&mut self, api: &dyn Api) {
        let done = self
            .pending
            .iter()
            .take_while(|(_, _, end)| api.event_query(*end).unwrap_or(true))
            .count();
        for (key, a, b) in self.pending.drain(..done) {
            if let Ok(ms) = api.event_elapsed_ms(a, b) {
                let t = self.totals.entry(key).or_default();
                t.0 += 1;
                t.1 += ms as f64;
            }
            self.free.extend([a, b]);
        }
    }

    /// The sums so far, longest first, and starts new ones.
    pub(crate) fn take(&mut self) -> Vec<OpTime> {
        let mut v: Vec<OpTime> = std::mem::take(&mut self.totals)
            .into_iter()
            .map(|(key, (calls, ms))| OpTime::new(key, calls, ms))
            .collect();
        OpTime::sort_longest_first(&mut v);
        v
    }

    /// Destroys every event (the stream must have passed them).
    pub(crate) fn destroy(&mut self, api: &dyn Api) {
        for (_, a, b) in self.pending.drain(..) {
            api.event_destroy(a);
            api.event_destroy(b);
        }
        for e in self.free.drain(..) {
            api.event_destroy(e);
        }
    }
}
