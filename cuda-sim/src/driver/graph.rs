//! Stream capture and CUDA graphs (`cuStreamBeginCapture`, `cuStreamEndCapture`,
//! `cuGraphInstantiate`, `cuGraphLaunch`, `cuGraphExecUpdate`), with the driver's rules
//! for what may happen while a stream captures.
//!
//! - While a stream captures, the kernels, copies and memsets enqueued on it become
//!   nodes of a graph instead of running; kernel arguments are copied at the call, so a
//!   later change of the caller's argument memory does not change the graph. Event
//!   records on it mark a point of the capture; waits on such an event from the same
//!   capture add nothing (a capture here is one stream: nodes run in capture order).
//! - An executable graph launched on a stream is one operation of that stream: its
//!   nodes run in capture order, each with the checks it has on a stream, so a pointer
//!   baked into the graph that was freed since is a use-after-free fault when it runs.
//!   Launched on a capturing stream, its nodes join that capture.
//! - The calls a capture forbids fail with the driver's codes and invalidate the capture
//!   (ending it then fails with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, no graph):
//!   synchronising or querying the capturing stream, or an event recorded in it
//!   (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); a copy from or to pageable memory into
//!   the capture (the same); a wait on an event recorded outside the capture
//!   (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`); "potentially unsafe" calls (allocation and
//!   freeing of device or pinned memory, the synchronous copies and memsets, a device
//!   synchronisation) from the capturing thread in thread-local mode or from any thread
//!   in global mode (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); the legacy NULL stream
//!   used while a blocking stream of its device captures
//!   (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`). Relaxed mode forbids no unsafe call.
//! - Ending a capture that was not begun is `CUDA_ERROR_ILLEGAL_STATE`; ending one begun
//!   in global or thread-local mode from another thread is
//!   `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`; an event last recorded in a capture that
//!   ended stands for a graph node and cannot be waited on or queried
//!   (`CUDA_ERROR_CAPTURED_EVENT`).
//!
//! Not emulated: captures that span several streams (a stream joining a capture by
//! waiting on an event recorded in it is `CUDA_ERROR_NOT_SUPPORTED`), a thread's own
//! capture mode (`cuThreadExchangeStreamCaptureMode`), and graphs built node by node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::ThreadId;

use super::ops::{DeviceCopy, Fill, HostDst, HostSrc, LaunchOp, Op};
use super::pinned::HostPtr;
use super::stream::{StreamKind, StreamShared};
use super::{lock, read, write, Driver, StreamHandle};
use crate::error::{CuError, ErrorCode};

/// A captured graph (`CUgraph`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphHandle(pub u64);

/// An executable graph (`CUgraphExec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphExecHandle(pub u64);

/// Which calls a capture forbids, as `CUstreamCaptureMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaptureMode {
    /// Unsafe calls are forbidden to every thread while the capture lasts.
    Global,
    /// Unsafe calls are forbidden to the thread that began the capture.
    ThreadLocal,
    /// No call is forbidden for being unsafe.
    Relaxed,
}

/// A stream's capture status, as `CUstreamCaptureStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// Not capturing.
    None,
    /// Capturing.
    Active,
    /// Capturing, but invalidated by an error: ending it returns no graph.
    Invalidated,
}

/// One node of a graph: an operation of a stream, as it was enqueued.
#[derive(Clone)]
pub(crate) enum Node {
    Kernel(LaunchOp),
    HtoD {
        dst: u64,
        src: HostPtr,
        len: usize,
        api: &'static str,
    },
    DtoH {
        dst: HostPtr,
        src: u64,
        len: usize,
        api: &'static str,
    },
    DtoD(DeviceCopy),
    Memset(Fill),
    /// An operation that fails when it runs (an injected error).
    Fail(CuError),
}

impl Node {
    /// The stream operation that runs this node.
    pub(crate) fn to_op(&self) -> Op {
        match self {
            // A replayed kernel is not profiled: its stamp (order, tag) belongs to the
            // launch that was captured, and a profile counts launches made on streams.
            Node::Kernel(l) => Op::Launch(Box::new(LaunchOp {
                stamp: None,
                ..l.clone()
            })),
            &Node::HtoD { dst, src, len, api } => Op::HtoD {
                dst,
                src: HostSrc::Pinned(src, len),
                api,
            },
            &Node::DtoH { dst, src, len, api } => Op::DtoH {
                dst: HostDst::Pinned(dst),
                src,
                len,
                api,
            },
            &Node::DtoD(c) => Op::DtoD(c),
            &Node::Memset(f) => Op::Memset(f),
            Node::Fail(e) => Op::Fail(e.clone()),
        }
    }

    /// Whether `other` may replace this node in an update of an executable graph: the
    /// same kind of node and, for a kernel, the same kernel.
    fn updatable_to(&self, other: &Node) -> bool {
        match (self, other) {
            (Node::Kernel(a), Node::Kernel(b)) => {
                Arc::ptr_eq(&a.module, &b.module) && a.kernel == b.kernel
            }
            (Node::HtoD { .. }, Node::HtoD { .. })
            | (Node::DtoH { .. }, Node::DtoH { .. })
            | (Node::DtoD(_), Node::DtoD(_))
            | (Node::Memset(_), Node::Memset(_))
            | (Node::Fail(_), Node::Fail(_)) => true,
            _ => false,
        }
    }
}

/// A capture in progress on one stream.
pub(crate) struct Capture {
    stream: u64,
    dev: usize,
    /// The stream orders against the legacy NULL stream.
    blocking: bool,
    mode: CaptureMode,
    thread: ThreadId,
    state: Mutex<CaptureState>,
}

#[derive(Default)]
struct CaptureState {
    nodes: Vec<Node>,
    /// Why the capture was invalidated, once it was.
    invalid: Option<String>,
    ended: bool,
}

impl Capture {
    fn invalidate(&self, why: String) {
        let mut s = lock(&self.state);
        if s.invalid.is_none() {
            s.invalid = Some(why);
        }
    }

    /// Whether an unsafe call by the calling thread is forbidden by this capture.
    fn forbids_unsafe_here(&self) -> bool {
        match self.mode {
            CaptureMode::Global => true,
            CaptureMode::ThreadLocal => self.thread == std::thread::current().id(),
            CaptureMode::Relaxed => false,
        }
    }

    /// Whether the capture has ended (its events stand for graph nodes).
    pub(crate) fn ended(&self) -> bool {
        lock(&self.state).ended
    }

    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` if an error invalidated the capture.
    fn check_valid(&self) -> Result<(), CuError> {
        match &lock(&self.state).invalid {
            Some(why) => Err(CuError::new(
                ErrorCode::StreamCaptureInvalidated,
                format!(
                    "the capture on stream {} was invalidated: {why}",
                    self.stream
                ),
            )),
            None => Ok(()),
        }
    }

    /// The error of a call the capture forbids (`code`), which invalidates it.
    pub(crate) fn forbid(&self, code: ErrorCode, what: String) -> CuError {
        let e = CuError::new(
            code,
            format!("{what} while stream {} is capturing", self.stream),
        );
        self.invalidate(format!("{what} ({})", code.name()));
        e
    }

    /// Appends `op` (enqueued on the capturing stream) as a node.
    pub(crate) fn record(&self, op: Op) -> Result<(), CuError> {
        self.check_valid()?;
        let node = match op {
            Op::Marker | Op::Stamp(_) => return Ok(()),
            Op::Launch(l) => Node::Kernel(*l),
            Op::HtoD {
                dst,
                src: HostSrc::Pinned(src, len),
                api,
            } => Node::HtoD { dst, src, len, api },
            Op::DtoH {
                dst: HostDst::Pinned(dst),
                src,
                len,
                api,
            } => Node::DtoH { dst, src, len, api },
            Op::HtoD {
                src: HostSrc::Staged(_),
                api,
                ..
            }
            | Op::DtoH {
                dst: HostDst::Staged(_),
                api,
                ..
            } => {
                return Err(self.forbid(
                    ErrorCode::StreamCaptureUnsupported,
                    format!("{api} with pageable host memory"),
                ))
            }
            Op::DtoD(c) => Node::DtoD(c),
            Op::Memset(f) => Node::Memset(f),
            Op::Fail(e) => Node::Fail(e),
            Op::Graph(nodes) => {
                lock(&self.state).nodes.extend(nodes.iter().cloned());
                return Ok(());
            }
        };
        lock(&self.state).nodes.push(node);
        Ok(())
    }
}

/// A captured graph.
struct Graph {
    dev: usize,
    nodes: Arc<[Node]>,
}

/// An executable graph: its nodes, replaced as a whole by an update (launches already
/// enqueued keep the nodes they were launched with).
struct GraphExec {
    dev: usize,
    nodes: Mutex<Arc<[Node]>>,
}

/// The driver's captures and graphs.
#[derive(Default)]
pub(crate) struct Graphs {
    /// Captures in progress (few: the check of unsafe calls walks them).
    captures: Mutex<Vec<Arc<Capture>>>,
    /// `captures.len()`, read without the lock by every unsafe call.
    active: AtomicUsize,
    graphs: RwLock<HashMap<u64, Arc<Graph>>>,
    execs: RwLock<HashMap<u64, Arc<GraphExec>>>,
}

impl Graphs {
    fn captures(&self) -> Vec<Arc<Capture>> {
        if self.active.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        lock(&self.captures).clone()
    }

    fn remove(&self, cap: &Arc<Capture>) {
        let mut caps = lock(&self.captures);
        caps.retain(|c| !Arc::ptr_eq(c, cap));
        self.active.store(caps.len(), Ordering::Release);
    }
}

fn invalid_handle(what: &str, id: u64) -> CuError {
    CuError::new(ErrorCode::InvalidHandle, format!("no {what} {id}"))
}

impl Driver {
    /// Whether any stream captures.
    pub(crate) fn any_capture(&self) -> bool {
        self.graphs.active.load(Ordering::Acquire) > 0
    }

    /// `Err` if a capture forbids the calling thread unsafe calls such as `api` (an
    /// allocation, a free, a synchronous copy): `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`,
    /// and the capture is invalidated.
    pub(crate) fn check_unsafe_call(&self, api: &str) -> Result<(), CuError> {
        for cap in self.graphs.captures() {
            if cap.forbids_unsafe_here() {
                return Err(cap.forbid(
                    ErrorCode::StreamCaptureUnsupported,
                    format!("{api} (a potentially unsafe call in {:?} mode)", cap.mode),
                ));
            }
        }
        Ok(())
    }

    /// `Err` if using device `dev`'s legacy NULL stream (`api`) is not permitted now: a
    /// blocking stream of the device captures (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`), or
    /// a capture forbids the calling thread unsafe calls. Either invalidates the capture.
    pub(crate) fn check_legacy_use(&self, dev: usize, api: &str) -> Result<(), CuError> {
        for cap in self.graphs.captures() {
            if cap.dev == dev && cap.blocking {
                return Err(cap.forbid(
                    ErrorCode::StreamCaptureImplicit,
                    format!("{api} on the legacy NULL stream (ordered after the blocking stream)"),
                ));
            }
            if cap.forbids_unsafe_here() {
                return Err(cap.forbid(
                    ErrorCode::StreamCaptureUnsupported,
                    format!("{api} on the legacy NULL stream in {:?} mode", cap.mode),
                ));
            }
        }
        Ok(())
    }

    /// `Err` if any stream of device `dev` captures (a device synchronisation would wait
    /// on it): `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, invalidating those captures.
    pub(crate) fn check_no_capture_on(&self, dev: usize, api: &str) -> Result<(), CuError> {
        let mut err = None;
        for cap in self.graphs.captures() {
            if cap.dev == dev {
                err.get_or_insert(cap.forbid(ErrorCode::StreamCaptureUnsupported, api.into()));
            }
        }
        err.map_or(Ok(()), Err)
    }

    /// Ends the capture on `st` without a graph (the stream is being destroyed).
    pub(crate) fn drop_capture(&self, st: &StreamShared) {
        if let Some(cap) = lock(&st.capture).take() {
            lock(&cap.state).ended = true;
            self.graphs.remove(&cap);
        }
    }

    /// Begins capturing the work enqueued on `s` into a graph (`cuStreamBeginCapture`),
    /// forbidding unsafe calls as `mode` says. The legacy NULL stream cannot capture
    /// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); a stream already capturing is
    /// `CUDA_ERROR_ILLEGAL_STATE`.
    pub fn stream_begin_capture(&self, s: StreamHandle, mode: CaptureMode) -> Result<(), CuError> {
        let st = self.stream_of(s)?;
        self.check_sticky(st.dev)?;
        if st.kind == StreamKind::Legacy {
            return Err(CuError::new(
                ErrorCode::StreamCaptureUnsupported,
                "the legacy NULL stream cannot capture",
            ));
        }
        let mut slot = lock(&st.capture);
        if slot.is_some() {
            return Err(CuError::new(
                ErrorCode::IllegalState,
                format!("stream {} is already capturing", s.0),
            ));
        }
        let cap = Arc::new(Capture {
            stream: st.id,
            dev: st.dev,
            blocking: st.kind == StreamKind::Blocking,
            mode,
            thread: std::thread::current().id(),
            state: Mutex::new(CaptureState::default()),
        });
        *slot = Some(Arc::clone(&cap));
        let mut caps = lock(&self.graphs.captures);
        caps.push(cap);
        self.graphs.active.store(caps.len(), Ordering::Release);
        Ok(())
    }

    /// Ends the capture on `s` and returns its graph (`cuStreamEndCapture`). An
    /// invalidated capture ends with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and no graph;
    /// a stream not capturing is `CUDA_ERROR_ILLEGAL_STATE`; a capture begun in global or
    /// thread-local mode, ended from another thread, is
    /// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` (and goes on).
    pub fn stream_end_capture(&self, s: StreamHandle) -> Result<GraphHandle, CuError> {
        let st = self.stream_of(s)?;
        let cap = {
            let mut slot = lock(&st.capture);
            let Some(cap) = slot.as_ref() else {
                return Err(CuError::new(
                    ErrorCode::IllegalState,
                    format!("stream {} is not capturing", s.0),
                ));
            };
            if cap.mode != CaptureMode::Relaxed && cap.thread != std::thread::current().id() {
                return Err(CuError::new(
                    ErrorCode::StreamCaptureWrongThread,
                    format!(
                        "the capture on stream {} was begun in {:?} mode by another thread",
                        s.0, cap.mode
                    ),
                ));
            }
            slot.take().expect("checked above")
        };
        self.graphs.remove(&cap);
        let nodes = {
            let mut state = lock(&cap.state);
            state.ended = true;
            std::mem::take(&mut state.nodes)
        };
        cap.check_valid()?;
        self.check_sticky(st.dev)?;
        let id = self.next_id();
        let g = Graph {
            dev: st.dev,
            nodes: nodes.into(),
        };
        write(&self.graphs.graphs).insert(id, Arc::new(g));
        Ok(GraphHandle(id))
    }

    /// Whether `s` is capturing (`cuStreamIsCapturing`).
    pub fn stream_is_capturing(&self, s: StreamHandle) -> Result<CaptureStatus, CuError> {
        let st = self.stream_of(s)?;
        let cap = lock(&st.capture).clone();
        Ok(match cap {
            None => CaptureStatus::None,
            Some(c) if c.check_valid().is_err() => CaptureStatus::Invalidated,
            Some(_) => CaptureStatus::Active,
        })
    }

    fn graph_of(&self, g: GraphHandle) -> Result<Arc<Graph>, CuError> {
        read(&self.graphs.graphs)
            .get(&g.0)
            .cloned()
            .ok_or_else(|| invalid_handle("graph", g.0))
    }

    fn exec_of(&self, e: GraphExecHandle) -> Result<Arc<GraphExec>, CuError> {
        read(&self.graphs.execs)
            .get(&e.0)
            .cloned()
            .ok_or_else(|| invalid_handle("executable graph", e.0))
    }

    /// Number of nodes of a graph (`cuGraphGetNodes`).
    pub fn graph_node_count(&self, g: GraphHandle) -> Result<usize, CuError> {
        Ok(self.graph_of(g)?.nodes.len())
    }

    /// An executable graph of `g`'s nodes (`cuGraphInstantiate`); `g` may be destroyed
    /// afterwards.
    pub fn graph_instantiate(&self, g: GraphHandle) -> Result<GraphExecHandle, CuError> {
        let graph = self.graph_of(g)?;
        self.check_sticky(graph.dev)?;
        let id = self.next_id();
        let e = GraphExec {
            dev: graph.dev,
            nodes: Mutex::new(Arc::clone(&graph.nodes)),
        };
        write(&self.graphs.execs).insert(id, Arc::new(e));
        Ok(GraphExecHandle(id))
    }

    /// Gives executable graph `e` the nodes of `g` (`cuGraphExecUpdate`): kernel
    /// arguments, dimensions, copy and memset operands may change; the number, order and
    /// kinds of the nodes and each kernel node's kernel may not
    /// (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`, `e` unchanged). Launches already enqueued
    /// run the nodes they were launched with.
    pub fn graph_exec_update(&self, e: GraphExecHandle, g: GraphHandle) -> Result<(), CuError> {
        let exec = self.exec_of(e)?;
        let graph = self.graph_of(g)?;
        self.check_sticky(exec.dev)?;
        let mut nodes = lock(&exec.nodes);
        let fail = |why: String| Err(CuError::new(ErrorCode::GraphExecUpdateFailure, why));
        if graph.dev != exec.dev {
            return fail(format!(
                "graph {} is of device {}, the executable graph of device {}",
                g.0, graph.dev, exec.dev
            ));
        }
        if graph.nodes.len() != nodes.len() {
            return fail(format!(
                "graph {} has {} nodes, the executable graph {}",
                g.0,
                graph.nodes.len(),
                nodes.len()
            ));
        }
        if let Some(i) = (0..nodes.len()).find(|&i| !nodes[i].updatable_to(&graph.nodes[i])) {
            return fail(format!(
                "node {i} of graph {} differs in kind or kernel from the executable graph's",
                g.0
            ));
        }
        *nodes = Arc::clone(&graph.nodes);
        Ok(())
    }

    /// Launches executable graph `e` on `s` (`cuGraphLaunch`): one operation of the
    /// stream that runs the nodes in capture order. On a capturing stream the nodes join
    /// the capture.
    pub fn graph_launch(&self, e: GraphExecHandle, s: StreamHandle) -> Result<(), CuError> {
        let exec = self.exec_of(e)?;
        let st = self.stream_of(s)?;
        if exec.dev != st.dev {
            return Err(CuError::new(
                ErrorCode::InvalidValue,
                format!(
                    "executable graph {} of device {} launched on a stream of device {}",
                    e.0, exec.dev, st.dev
                ),
            ));
        }
        self.check_sticky(st.dev)?;
        let nodes = Arc::clone(&lock(&exec.nodes));
        self.enqueue(&st, Vec::new(), Op::Graph(nodes)).map(|_| ())
    }

    /// Destroys a graph (`cuGraphDestroy`); executable graphs made from it stay.
    pub fn graph_destroy(&self, g: GraphHandle) -> Result<(), CuError> {
        write(&self.graphs.graphs)
            .remove(&g.0)
            .map(|_| ())
            .ok_or_else(|| invalid_handle("graph", g.0))
    }

    /// Destroys an executable graph (`cuGraphExecDestroy`); launches already enqueued
    /// still run.
    pub fn graph_exec_destroy(&self, e: GraphExecHandle) -> Result<(), CuError> {
        write(&self.graphs.execs)
            .remove(&e.0)
            .map(|_| ())
            .ok_or_else(|| invalid_handle("executable graph", e.0))
    }

    /// Graphs and executable graphs alive (for leak checks).
    pub fn graph_count(&self) -> (usize, usize) {
        (
            read(&self.graphs.graphs).len(),
            read(&self.graphs.execs).len(),
        )
    }
}
