//! What a backend asks of the driver on the host: driver calls by kind, kernels the GPU
//! runs, graph launches, host waits, bytes over PCIe, and the host time `graph_compute`
//! spends per node. Read with [`CudaBackend::host_counters`](crate::CudaBackend::host_counters).
//!
//! The counts are taken in ggml-cuda, over the calls it makes through its driver
//! interface, so a run on a GPU and a run on cuda-sim count the same way.

use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Driver calls by kind. Each is one call into the driver (libcuda or cuda-sim's
/// emulated one) made by the backend on the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCalls {
    /// `cuLaunchKernel`, on a stream or into a capture.
    pub launch: u64,
    /// `cuGraphLaunch`.
    pub graph_launch: u64,
    /// Host-to-device copies (`cuMemcpyHtoDAsync`).
    pub memcpy_htod: u64,
    /// Device-to-host copies (`cuMemcpyDtoHAsync`).
    pub memcpy_dtoh: u64,
    /// Device-to-device and peer copies (`cuMemcpyDtoDAsync`, `cuMemcpyPeerAsync`).
    pub memcpy_dtod: u64,
    /// `cuMemsetD8Async`.
    pub memset: u64,
    /// `cuEventRecord`.
    pub event_record: u64,
    /// `cuStreamWaitEvent`.
    pub event_wait: u64,
    /// `cuEventSynchronize`.
    pub event_sync: u64,
    /// `cuEventQuery`.
    pub event_query: u64,
    /// `cuStreamSynchronize` (copies into pageable memory include one).
    pub stream_sync: u64,
    /// Everything else: allocation, creation and destruction of streams, events and
    /// graphs, stream capture, graph instantiation, context switches, function
    /// attributes.
    pub other: u64,
}

impl DriverCalls {
    /// All calls.
    pub fn total(&self) -> u64 {
        self.launch
            + self.graph_launch
            + self.memcpy_htod
            + self.memcpy_dtoh
            + self.memcpy_dtod
            + self.memset
            + self.event_record
            + self.event_wait
            + self.event_sync
            + self.event_query
            + self.stream_sync
            + self.other
    }

    /// Each kind with its count, named as the fields.
    pub fn by_kind(&self) -> [(&'static str, u64); 12] {
        [
            ("launch", self.launch),
            ("graph_launch", self.graph_launch),
            ("memcpy_htod", self.memcpy_htod),
            ("memcpy_dtoh", self.memcpy_dtoh),
            ("memcpy_dtod", self.memcpy_dtod),
            ("memset", self.memset),
            ("event_record", self.event_record),
            ("event_wait", self.event_wait),
            ("event_sync", self.event_sync),
            ("event_query", self.event_query),
            ("stream_sync", self.stream_sync),
            ("other", self.other),
        ]
    }

    fn zip(self, o: DriverCalls, f: impl Fn(u64, u64) -> u64) -> DriverCalls {
        DriverCalls {
            launch: f(self.launch, o.launch),
            graph_launch: f(self.graph_launch, o.graph_launch),
            memcpy_htod: f(self.memcpy_htod, o.memcpy_htod),
            memcpy_dtoh: f(self.memcpy_dtoh, o.memcpy_dtoh),
            memcpy_dtod: f(self.memcpy_dtod, o.memcpy_dtod),
            memset: f(self.memset, o.memset),
            event_record: f(self.event_record, o.event_record),
            event_wait: f(self.event_wait, o.event_wait),
            event_sync: f(self.event_sync, o.event_sync),
            event_query: f(self.event_query, o.event_query),
            stream_sync: f(self.stream_sync, o.stream_sync),
            other: f(self.other, o.other),
        }
    }
}

/// A backend's host-side counters since it was created or last reset
/// ([`CudaBackend::reset_host_counters`](crate::CudaBackend::reset_host_counters)).
/// Differences of two snapshots (`after - before`) give the counts of what ran in
/// between; sums (`a + b`) combine devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCounters {
    /// Driver calls by kind.
    pub calls: DriverCalls,
    /// Kernels the GPU ran: launched one by one, or as kernel nodes of a replayed CUDA
    /// graph (each replay counts each of its kernels). Launches recorded into a capture
    /// do not run and do not count here (they count as driver calls).
    pub kernel_launches: u64,
    /// Graph launches (`cuGraphLaunch`).
    pub graph_launches: u64,
    /// Nodes of the replayed graphs (kernels, copies and memsets), per replay.
    pub graph_nodes: u64,
    /// Graphs captured and instantiated.
    pub graph_captures: u64,
    /// Times the host waited for the GPU: stream and event synchronisations, a copy
    /// into pageable memory, a timed wait (however many queries it polled).
    pub host_syncs: u64,
    /// Bytes copied from the host to the GPU (graph copy nodes per replay included).
    pub h2d_bytes: u64,
    /// Bytes copied from the GPU to the host (graph copy nodes per replay included).
    pub d2h_bytes: u64,
    /// Calls of `graph_compute`.
    pub graph_compute_calls: u64,
    /// Nodes passed to `graph_compute` (views included), summed over calls.
    pub graph_compute_nodes: u64,
    /// Host time spent inside `graph_compute`, in nanoseconds.
    pub graph_compute_ns: u64,
}

impl HostCounters {
    /// Every driver call.
    pub fn driver_calls(&self) -> u64 {
        self.calls.total()
    }

    /// Host time of `graph_compute` per node passed to it, in nanoseconds (0 without
    /// nodes).
    pub fn host_ns_per_node(&self) -> f64 {
        match self.graph_compute_nodes {
            0 => 0.0,
            n => self.graph_compute_ns as f64 / n as f64,
        }
    }

    fn zip(self, o: HostCounters, f: impl Fn(u64, u64) -> u64 + Copy) -> HostCounters {
        HostCounters {
            calls: self.calls.zip(o.calls, f),
            kernel_launches: f(self.kernel_launches, o.kernel_launches),
            graph_launches: f(self.graph_launches, o.graph_launches),
            graph_nodes: f(self.graph_nodes, o.graph_nodes),
            graph_captures: f(self.graph_captures, o.graph_captures),
            host_syncs: f(self.host_syncs, o.host_syncs),
            h2d_bytes: f(self.h2d_bytes, o.h2d_bytes),
            d2h_bytes: f(self.d2h_bytes, o.d2h_bytes),
            graph_compute_calls: f(self.graph_compute_calls, o.graph_compute_calls),
            graph_compute_nodes: f(self.graph_compute_nodes, o.graph_compute_nodes),
            graph_compute_ns: f(self.graph_compute_ns, o.graph_compute_ns),
        }
    }
}

impl Add for HostCounters {
    type Output = HostCounters;
    fn add(self, o: HostCounters) -> HostCounters {
        self.zip(o, u64::wrapping_add)
    }
}

impl Sub for HostCounters {
    type Output = HostCounters;
    /// Counts between two snapshots (saturating at 0 if a reset came in between).
    fn sub(self, o: HostCounters) -> HostCounters {
        self.zip(o, u64::saturating_sub)
    }
}

impl std::iter::Sum for HostCounters {
    fn sum<I: Iterator<Item = HostCounters>>(iter: I) -> HostCounters {
        iter.fold(HostCounters::default(), Add::add)
    }
}

/// Kind of a counted driver call (an index into [`Counters::calls`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Launch,
    GraphLaunch,
    MemcpyHtod,
    MemcpyDtoh,
    MemcpyDtod,
    Memset,
    EventRecord,
    EventWait,
    EventSync,
    EventQuery,
    StreamSync,
    Other,
}

const CALL_KINDS: usize = 12;

/// What a captured graph does each time it is replayed, tallied while it is captured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GraphTally {
    pub kernels: u64,
    pub nodes: u64,
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
}

/// The live counters of one backend (shared between the threads that call it).
#[derive(Default)]
pub(crate) struct Counters {
    calls: [AtomicU64; CALL_KINDS],
    kernel_launches: AtomicU64,
    graph_launches: AtomicU64,
    graph_nodes: AtomicU64,
    graph_captures: AtomicU64,
    host_syncs: AtomicU64,
    h2d_bytes: AtomicU64,
    d2h_bytes: AtomicU64,
    graph_compute_calls: AtomicU64,
    graph_compute_nodes: AtomicU64,
    graph_compute_ns: AtomicU64,
    /// The backend's stream is capturing: launches, copies and memsets become graph
    /// nodes (tallied below) instead of running.
    capturing: AtomicBool,
    tally_kernels: AtomicU64,
    tally_nodes: AtomicU64,
    tally_h2d: AtomicU64,
    tally_d2h: AtomicU64,
}

fn bump(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn call(&self, c: Call) {
        bump(&self.calls[c as usize], 1);
    }

    pub(crate) fn host_sync(&self) {
        bump(&self.host_syncs, 1);
    }

    /// A kernel launched on the stream: runs now, or becomes a node of the capture.
    pub(crate) fn kernel(&self) {
        if self.capturing.load(Ordering::Relaxed) {
            bump(&self.tally_kernels, 1);
            bump(&self.tally_nodes, 1);
        } else {
            bump(&self.kernel_launches, 1);
        }
    }

    /// A copy or memset on the stream (`h2d`/`d2h` bytes over PCIe).
    pub(crate) fn transfer(&self, h2d: u64, d2h: u64) {
        if self.capturing.load(Ordering::Relaxed) {
            bump(&self.tally_nodes, 1);
            bump(&self.tally_h2d, h2d);
            bump(&self.tally_d2h, d2h);
        } else {
            bump(&self.h2d_bytes, h2d);
            bump(&self.d2h_bytes, d2h);
        }
    }

    /// Starts tallying the nodes of a capture.
    pub(crate) fn begin_capture(&self) {
        for a in [
            &self.tally_kernels,
            &self.tally_nodes,
            &self.tally_h2d,
            &self.tally_d2h,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        self.capturing.store(true, Ordering::Relaxed);
    }

    /// Ends the capture; what its graph does per replay.
    pub(crate) fn end_capture(&self) -> GraphTally {
        self.capturing.store(false, Ordering::Relaxed);
        GraphTally {
            kernels: self.tally_kernels.load(Ordering::Relaxed),
            nodes: self.tally_nodes.load(Ordering::Relaxed),
            h2d_bytes: self.tally_h2d.load(Ordering::Relaxed),
            d2h_bytes: self.tally_d2h.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn captured(&self) {
        bump(&self.graph_captures, 1);
    }

    /// A graph launch that replays what `t` tallied.
    pub(crate) fn replayed(&self, t: &GraphTally) {
        bump(&self.graph_launches, 1);
        bump(&self.kernel_launches, t.kernels);
        bump(&self.graph_nodes, t.nodes);
        bump(&self.h2d_bytes, t.h2d_bytes);
        bump(&self.d2h_bytes, t.d2h_bytes);
    }

    /// One `graph_compute` of `nodes` nodes that took `ns` of host time.
    pub(crate) fn graph_compute(&self, nodes: usize, ns: u64) {
        bump(&self.graph_compute_calls, 1);
        bump(&self.graph_compute_nodes, nodes as u64);
        bump(&self.graph_compute_ns, ns);
    }

    pub(crate) fn snapshot(&self) -> HostCounters {
        let c = |i: Call| self.calls[i as usize].load(Ordering::Relaxed);
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HostCounters {
            calls: DriverCalls {
                launch: c(Call::Launch),
                graph_launch: c(Call::GraphLaunch),
                memcpy_htod: c(Call::MemcpyHtod),
                memcpy_dtoh: c(Call::MemcpyDtoh),
                memcpy_dtod: c(Call::MemcpyDtod),
                memset: c(Call::Memset),
                event_record: c(Call::EventRecord),
                event_wait: c(Call::EventWait),
                event_sync: c(Call::EventSync),
                event_query: c(Call::EventQuery),
                stream_sync: c(Call::StreamSync),
                other: c(Call::Other),
            },
            kernel_launches: l(&self.kernel_launches),
            graph_launches: l(&self.graph_launches),
            graph_nodes: l(&self.graph_nodes),
            graph_captures: l(&self.graph_captures),
            host_syncs: l(&self.host_syncs),
            h2d_bytes: l(&self.h2d_bytes),
            d2h_bytes: l(&self.d2h_bytes),
            graph_compute_calls: l(&self.graph_compute_calls),
            graph_compute_nodes: l(&self.graph_compute_nodes),
            graph_compute_ns: l(&self.graph_compute_ns),
        }
    }

    pub(crate) fn reset(&self) {
        for a in self.calls.iter().chain([
            &self.kernel_launches,
            &self.graph_launches,
            &self.graph_nodes,
            &self.graph_captures,
            &self.host_syncs,
            &self.h2d_bytes,
            &self.d2h_bytes,
            &self.graph_compute_calls,
            &self.graph_compute_nodes,
            &self.graph_compute_ns,
        ]) {
            a.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_work_counts_per_replay_not_at_capture() {
        let c = Counters::default();
        c.kernel();
        c.transfer(16, 0);
        c.begin_capture();
        c.kernel();
        c.kernel();
        c.transfer(0, 256);
        let t = c.end_capture();
        assert_eq!(
            t,
            GraphTally {
                kernels: 2,
                nodes: 3,
                h2d_bytes: 0,
                d2h_bytes: 256
            }
        );
        c.replayed(&t);
        c.replayed(&t);
        let s = c.snapshot();
        assert_eq!(s.kernel_launches, 1 + 4);
        assert_eq!((s.graph_launches, s.graph_nodes), (2, 6));
        assert_eq!((s.h2d_bytes, s.d2h_bytes), (16, 512));
        c.reset();
        assert_eq!(c.snapshot(), HostCounters::default());
    }

    #[test]
    fn differences_and_sums() {
        let c = Counters::default();
        c.call(Call::Launch);
        c.call(Call::EventQuery);
        let a = c.snapshot();
        c.call(Call::Launch);
        c.call(Call::Other);
        c.graph_compute(10, 500);
        let d = c.snapshot() - a;
        assert_eq!(d.calls.launch, 1);
        assert_eq!(d.driver_calls(), 2);
        assert_eq!(d.host_ns_per_node(), 50.0);
        let s: HostCounters = [d, d].into_iter().sum();
        assert_eq!(s.driver_calls(), 4);
        // A reset between two snapshots saturates instead of wrapping.
        assert_eq!((a - c.snapshot()).calls.launch, 0);
    }
}
