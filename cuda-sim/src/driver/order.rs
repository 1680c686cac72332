//! Stream management and the ordering rules between streams: the legacy NULL stream of
//! a context waits for all earlier work of the context's blocking streams, and every
//! later operation of a blocking stream waits for it; non-blocking streams
//! (`CU_STREAM_NON_BLOCKING`) are not ordered with it at all.

use std::sync::Arc;

use super::ops::Op;
use super::stream::{Dep, StreamKind, StreamShared};
use super::{lock, read, write, Driver, StreamHandle};
use crate::error::{CuError, ErrorCode};

impl Driver {
    /// Appends `op` to `st` after `deps` and the legacy stream's implicit ordering; its
    /// sequence number.
    pub(crate) fn enqueue(
        &self,
        st: &Arc<StreamShared>,
        mut deps: Vec<Dep>,
        op: Op,
    ) -> Result<u64, CuError> {
        if let Some(cap) = st.capturing() {
            // Becomes a node of the graph (waits were checked by stream_wait_event).
            debug_assert!(deps.is_empty());
            cap.record(op)?;
            return Ok(0);
        }
        if st.kind == StreamKind::Legacy && self.any_capture() {
            self.check_legacy_use(st.dev, &op.describe())?;
        }
        if st.kind == StreamKind::NonBlocking {
            return st.push(deps, op);
        }
        let ctx = &self.shared.contexts[st.dev];
        // Held while the dependencies are read and the operation pushed, so that the
        // legacy stream and the blocking streams see one order of their operations.
        let blocking = lock(&ctx.blocking);
        if st.kind == StreamKind::Legacy {
            deps.extend(blocking.iter().filter_map(|b| b.tail()));
        } else {
            deps.extend(ctx.legacy.tail());
        }
        st.push(deps, op)
    }

    /// What synchronising `st` waits for: its work so far and, for the legacy stream,
    /// the work so far of the blocking streams (which its next operation would wait
    /// for).
    pub(crate) fn sync_targets(&self, st: &Arc<StreamShared>) -> Vec<Dep> {
        let mut deps: Vec<Dep> = st.tail().into_iter().collect();
        if st.kind == StreamKind::Legacy {
            let blocking = lock(&self.shared.contexts[st.dev].blocking);
            deps.extend(blocking.iter().filter_map(|b| b.tail()));
        }
        deps
    }

    /// `Err` if waiting for `st` is not permitted: it captures
    /// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), or it is the legacy stream and a
    /// capture forbids its use.
    fn check_capture_sync(&self, st: &StreamShared, api: &str) -> Result<(), CuError> {
        if let Some(cap) = st.capturing() {
            return Err(cap.forbid(
                ErrorCode::StreamCaptureUnsupported,
                format!("{api} of the capturing stream"),
            ));
        }
        if st.kind == StreamKind::Legacy {
            self.check_legacy_use(st.dev, api)?;
        }
        Ok(())
    }

    pub(crate) fn stream_of(&self, s: StreamHandle) -> Result<Arc<StreamShared>, CuError> {
        read(&self.streams)
            .get(&s.0)
            .cloned()
            .ok_or_else(|| CuError::new(ErrorCode::InvalidHandle, format!("no stream {}", s.0)))
    }

    /// A new stream of device `dev` with its own worker thread: with `non_blocking`
    /// (`CU_STREAM_NON_BLOCKING`) it does not order against the legacy NULL stream,
    /// without it it does.
    pub fn stream_create(&self, dev: usize, non_blocking: bool) -> Result<StreamHandle, CuError> {
        self.live_device(dev)?;
        let id = self.next_id();
        let kind = if non_blocking {
            StreamKind::NonBlocking
        } else {
            StreamKind::Blocking
        };
        let st = StreamShared::new(id, dev, kind);
        st.start(Arc::clone(&self.shared))?;
        if kind == StreamKind::Blocking {
            lock(&self.shared.contexts[dev].blocking).push(Arc::clone(&st));
        }
        write(&self.streams).insert(id, st);
        Ok(StreamHandle(id))
    }

    /// The legacy NULL stream of device `dev`'s context (usable wherever a stream is,
    /// not destroyable).
    pub fn legacy_stream(&self, dev: usize) -> Result<StreamHandle, CuError> {
        self.device(dev)?;
        Ok(StreamHandle(self.shared.contexts[dev].legacy.id))
    }

    /// Destroys a stream: its queued work still runs (the call waits for it), then its
    /// worker exits. On a poisoned context the stream is destroyed and the sticky
    /// error returned.
    pub fn stream_destroy(&self, s: StreamHandle) -> Result<(), CuError> {
        let st = {
            let mut streams = write(&self.streams);
            match streams.get(&s.0) {
                Some(st) if st.kind == StreamKind::Legacy => {
                    return Err(CuError::new(
                        ErrorCode::InvalidHandle,
                        "the legacy NULL stream cannot be destroyed",
                    ))
                }
                Some(_) => streams.remove(&s.0),
                None => None,
            }
        };
        let st =
            st.ok_or_else(|| CuError::new(ErrorCode::InvalidHandle, format!("no stream {}", s.0)))?;
        if st.kind == StreamKind::Blocking {
            lock(&self.shared.contexts[st.dev].blocking).retain(|b| !Arc::ptr_eq(b, &st));
        }
        self.drop_capture(&st);
        st.request_shutdown();
        st.join();
        self.check_sticky(st.dev)
    }

    /// Waits for the work enqueued on `s` so far (for the legacy stream, with the
    /// blocking streams' work it is ordered after). Returns the context's sticky error,
    /// or an asynchronous launch error of the stream.
    pub fn stream_synchronize(&self, s: StreamHandle) -> Result<(), CuError> {
        let st = self.stream_of(s)?;
        self.check_capture_sync(&st, "cuStreamSynchronize")?;
        for d in self.sync_targets(&st) {
            d.wait();
        }
        self.check_sticky(st.dev)?;
        st.take_deferred().map_or(Ok(()), Err)
    }

    /// `Ok` if all work enqueued on `s` completed, `CUDA_ERROR_NOT_READY` if not.
    pub fn stream_query(&self, s: StreamHandle) -> Result<(), CuError> {
        let st = self.stream_of(s)?;
        self.check_capture_sync(&st, "cuStreamQuery")?;
        self.check_sticky(st.dev)?;
        if self.sync_targets(&st).iter().all(Dep::is_done) {
            st.take_deferred().map_or(Ok(()), Err)
        } else {
            Err(CuError::new(
                ErrorCode::NotReady,
                format!("stream {} has pending work", s.0),
            ))
        }
    }

    /// Waits for the work enqueued so far on every stream of device `dev`.
    pub fn device_synchronize(&self, dev: usize) -> Result<(), CuError> {
        self.device(dev)?;
        self.check_no_capture_on(dev, "cuCtxSynchronize")?;
        let streams: Vec<Arc<StreamShared>> = read(&self.streams)
            .values()
            .filter(|st| st.dev == dev)
            .cloned()
            .collect();
        let targets: Vec<Dep> = streams.iter().filter_map(|st| st.tail()).collect();
        for d in targets {
            d.wait();
        }
        self.check_sticky(dev)?;
        streams
            .iter()
            .find_map(|st| st.take_deferred())
            .map_or(Ok(()), Err)
    }
}
