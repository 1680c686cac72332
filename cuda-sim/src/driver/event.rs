//! Events: a record captures its stream's position (everything enqueued on it up to the
//! record); a wait, query or synchronize uses the most recent record at the time of the
//! call. An event never recorded is complete. A timed event's record also notes the host
//! time at which the stream reached it, for [`Driver::event_elapsed_ms`].

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::graph::Capture;
use super::ops::Op;
use super::stream::Dep;
use super::{lock, read, write, Driver, EventHandle, InjectedError, StreamHandle};
use crate::error::{CuError, ErrorCode};

/// What the latest record of an event marks.
#[derive(Clone)]
enum Recorded {
    /// A position of a stream.
    Stream(Dep),
    /// A point of a capture (a node of its graph, not work on a stream).
    Capture(Arc<Capture>),
}

/// One event.
pub(crate) struct EventShared {
    pub(crate) dev: usize,
    /// What the latest record marks.
    last: Mutex<Option<Recorded>>,
    /// Created with timing: each record enqueues a stamp, the latest one is here.
    timed: bool,
    stamp: Mutex<Option<Arc<OnceLock<Instant>>>>,
}

/// The error of a wait for, or a query of, an event recorded in `cap`: forbidden while
/// the capture lasts (and invalidating it), meaningless once it ended.
fn captured_event_error(cap: &Capture, e: EventHandle, api: &str) -> CuError {
    if cap.ended() {
        CuError::new(
            ErrorCode::CapturedEvent,
            format!(
                "{api}: event {} was last recorded in a capture (it stands for a graph node)",
                e.0
            ),
        )
    } else {
        cap.forbid(
            ErrorCode::StreamCaptureUnsupported,
            format!("{api} of event {}, recorded in the capture,", e.0),
        )
    }
}

impl EventShared {
    /// The stream position of the latest record (`None` if never recorded), or the
    /// error of `api` on an event recorded in a capture.
    fn position(&self, e: EventHandle, api: &str) -> Result<Option<Dep>, CuError> {
        match lock(&self.last).clone() {
            None => Ok(None),
            Some(Recorded::Stream(d)) => Ok(Some(d)),
            Some(Recorded::Capture(cap)) => Err(captured_event_error(&cap, e, api)),
        }
    }
}

impl Driver {
    fn event_of(&self, e: EventHandle) -> Result<Arc<EventShared>, CuError> {
        read(&self.events)
            .get(&e.0)
            .cloned()
            .ok_or_else(|| CuError::new(ErrorCode::InvalidHandle, format!("no event {}", e.0)))
    }

    /// A new event of device `dev` (`CU_EVENT_DISABLE_TIMING`), complete until recorded.
    pub fn event_create(&self, dev: usize) -> Result<EventHandle, CuError> {
        self.new_event(dev, false)
    }

    /// A new event of device `dev` with timing (`CU_EVENT_DEFAULT`): two of them give
    /// the time between their records with [`Driver::event_elapsed_ms`].
    pub fn event_create_timed(&self, dev: usize) -> Result<EventHandle, CuError> {
        self.new_event(dev, true)
    }

    fn new_event(&self, dev: usize, timed: bool) -> Result<EventHandle, CuError> {
        self.live_device(dev)?;
        let id = self.next_id();
        let e = EventShared {
            dev,
            last: Mutex::new(None),
            timed,
            stamp: Mutex::new(None),
        };
        write(&self.events).insert(id, Arc::new(e));
        Ok(EventHandle(id))
    }

    /// Milliseconds between the latest records of two timed events
    /// (`cuEventElapsedTime`): the host times at which their streams reached them, so
    /// they measure the emulator, not a GPU. `CUDA_ERROR_INVALID_HANDLE` if either was
    /// created without timing or never recorded, `CUDA_ERROR_NOT_READY` if either has not
    /// completed; the sticky error if a record was skipped after one.
    pub fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32, CuError> {
        let mut at = [Instant::now(); 2];
        for (i, e) in [start, end].into_iter().enumerate() {
            let ev = self.event_of(e)?;
            self.check_sticky(ev.dev)?;
            ev.position(e, "cuEventElapsedTime")?;
            let invalid =
                |why: &str| CuError::new(ErrorCode::InvalidHandle, format!("event {} {why}", e.0));
            if !ev.timed {
                return Err(invalid("was created without timing"));
            }
            let stamp = lock(&ev.stamp)
                .clone()
                .ok_or_else(|| invalid("was never recorded"))?;
            at[i] = match stamp.get() {
                Some(t) => *t,
                None => {
                    return Err(CuError::new(
                        ErrorCode::NotReady,
                        format!("event {} has not completed", e.0),
                    ))
                }
            };
        }
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        Ok(if at[1] >= at[0] {
            ms(at[1] - at[0])
        } else {
            -ms(at[0] - at[1])
        } as f32)
    }

    /// Destroys an event. Waits that already captured it are unaffected.
    pub fn event_destroy(&self, e: EventHandle) -> Result<(), CuError> {
        let ev = write(&self.events)
            .remove(&e.0)
            .ok_or_else(|| CuError::new(ErrorCode::InvalidHandle, format!("no event {}", e.0)))?;
        self.check_sticky(ev.dev)
    }

    /// Captures in `e` the work enqueued on `s` so far (both of one device).
    pub fn event_record(&self, e: EventHandle, s: StreamHandle) -> Result<(), CuError> {
        let ev = self.event_of(e)?;
        let st = self.stream_of(s)?;
        if ev.dev != st.dev {
            return Err(CuError::new(
                ErrorCode::InvalidHandle,
                format!(
                    "event {} of device {} recorded on a stream of device {}",
                    e.0, ev.dev, st.dev
                ),
            ));
        }
        self.check_sticky(st.dev)?;
        if let Some(e) = self.take_injected(
            InjectedError::Event,
            |d| d == st.dev,
            &format!("cuEventRecord of event {} on stream {}", e.0, s.0),
        ) {
            return Err(e);
        }
        if let Some(cap) = st.capturing() {
            // A point of the capture: no operation, no time stamp.
            cap.record(Op::Marker)?;
            *lock(&ev.last) = Some(Recorded::Capture(cap));
            return Ok(());
        }
        // A marker operation, so that the legacy stream's implicit ordering applies to
        // the record like to any other operation.
        let op = if ev.timed {
            let at = Arc::new(OnceLock::new());
            *lock(&ev.stamp) = Some(at.clone());
            Op::Stamp(at)
        } else {
            Op::Marker
        };
        let seq = self.enqueue(&st, Vec::new(), op)?;
        *lock(&ev.last) = Some(Recorded::Stream(Dep { stream: st, seq }));
        Ok(())
    }

    /// `Ok` if the work captured by the latest record completed (or the event was
    /// never recorded), `CUDA_ERROR_NOT_READY` if not.
    pub fn event_query(&self, e: EventHandle) -> Result<(), CuError> {
        let ev = self.event_of(e)?;
        self.check_sticky(ev.dev)?;
        let dep = ev.position(e, "cuEventQuery")?;
        match dep {
            Some(d) if !d.is_done() => Err(CuError::new(
                ErrorCode::NotReady,
                format!("event {} has not completed", e.0),
            )),
            _ => Ok(()),
        }
    }

    /// Waits for the work captured by the latest record.
    pub fn event_synchronize(&self, e: EventHandle) -> Result<(), CuError> {
        let ev = self.event_of(e)?;
        self.check_sticky(ev.dev)?;
        let dep = ev.position(e, "cuEventSynchronize")?;
        if let Some(d) = dep {
            d.wait();
        }
        self.check_sticky(ev.dev)
    }

    /// Makes later work on `s` wait for the work captured by `e`'s latest record as of
    /// this call (a later record of `e` does not change it). Streams and events of
    /// different devices may be combined.
    pub fn stream_wait_event(&self, s: StreamHandle, e: EventHandle) -> Result<(), CuError> {
        let st = self.stream_of(s)?;
        let ev = self.event_of(e)?;
        self.check_sticky(st.dev)?;
        self.check_sticky(ev.dev)?;
        if let Some(e) = self.take_injected(
            InjectedError::Event,
            |d| d == st.dev,
            &format!("cuStreamWaitEvent of stream {} on event {}", s.0, e.0),
        ) {
            return Err(e);
        }
        let last = lock(&ev.last).clone();
        match (last, st.capturing()) {
            (None, _) => Ok(()),
            (Some(Recorded::Capture(c)), Some(mine)) if Arc::ptr_eq(&c, &mine) => {
                // Earlier in the same capture, which runs in order.
                mine.record(Op::Marker)
            }
            (Some(Recorded::Capture(_)), Some(mine)) => Err(mine.forbid(
                ErrorCode::StreamCaptureMerge,
                format!("a wait on event {}, recorded in another capture,", e.0),
            )),
            (Some(Recorded::Capture(c)), None) if !c.ended() => Err(CuError::new(
                ErrorCode::NotSupported,
                format!(
                    "stream {} would join the capture that recorded event {}: cuda-sim \
                     emulates captures of one stream",
                    s.0, e.0
                ),
            )),
            (Some(Recorded::Capture(c)), None) => {
                Err(captured_event_error(&c, e, "cuStreamWaitEvent"))
            }
            (Some(Recorded::Stream(_)), Some(mine)) => Err(mine.forbid(
                ErrorCode::StreamCaptureIsolation,
                format!("a wait on event {}, recorded outside the capture,", e.0),
            )),
            (Some(Recorded::Stream(d)), None) if !d.is_done() => {
                self.enqueue(&st, vec![d], Op::Marker).map(|_| ())
            }
            (Some(Recorded::Stream(_)), None) => Ok(()),
        }
    }
}
